//! An engine configuration: a name and the shell command line that starts its server, with
//! placeholders the campaign fills in for each boot.

use serde::Serialize;

use crate::error::BenchError;

/// The port the server must listen on.
pub const PORT: &str = "{port}";
/// The context window the server is booted with (the context campaign boots one per point
/// when the command takes it).
pub const MAX_MODEL_LEN: &str = "{max_model_len}";
/// The KV-cache memory every engine gets, in bytes.
pub const KV_CACHE_MEMORY_BYTES: &str = "{kv_cache_memory_bytes}";

/// One engine under test.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineSpec {
    /// Its name in tables and plots (`starling-plain`, `vllm`, …).
    pub name: String,
    /// The command line, run by `sh -c`, with [`PORT`], [`MAX_MODEL_LEN`] and
    /// [`KV_CACHE_MEMORY_BYTES`] placeholders.
    pub command: String,
}

/// The values one boot fills in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootParams {
    /// Port to listen on.
    pub port: u16,
    /// Context window, tokens.
    pub max_model_len_tokens: usize,
    /// KV-cache memory, bytes.
    pub kv_cache_memory_bytes: u64,
}

impl EngineSpec {
    /// Parses `NAME=COMMAND`; the command must take `{port}`.
    pub fn parse(text: &str) -> Result<EngineSpec, BenchError> {
        let (name, command) = text.split_once('=').ok_or_else(|| {
            BenchError::Invalid(format!(
                "engine `{text}`: expected NAME=COMMAND (e.g. plain='starling serve --port {PORT} …')"
            ))
        })?;
        let name = name.trim();
        let valid_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'));
        if !valid_name {
            return Err(BenchError::Invalid(format!(
                "engine name `{name}`: use letters, digits and - _ . @ (it names files)"
            )));
        }
        if !command.contains(PORT) {
            return Err(BenchError::Invalid(format!(
                "engine `{name}`: the command must contain {PORT}, where the campaign puts the port"
            )));
        }
        Ok(EngineSpec {
            name: name.to_owned(),
            command: command.trim().to_owned(),
        })
    }

    /// Whether the server can be booted at a chosen context window (the context campaign
    /// then boots one server per point; otherwise it sends its points to the shared server,
    /// which refuses prompts beyond its window).
    pub fn takes_max_model_len(&self) -> bool {
        self.command.contains(MAX_MODEL_LEN)
    }

    /// Whether the campaign sets this engine's KV memory.
    pub fn takes_kv_memory(&self) -> bool {
        self.command.contains(KV_CACHE_MEMORY_BYTES)
    }

    /// The command line of one boot.
    pub fn render(&self, params: BootParams) -> String {
        self.command
            .replace(PORT, &params.port.to_string())
            .replace(MAX_MODEL_LEN, &params.max_model_len_tokens.to_string())
            .replace(
                KV_CACHE_MEMORY_BYTES,
                &params.kv_cache_memory_bytes.to_string(),
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_render_every_placeholder() {
        let spec = EngineSpec::parse(
            "plain=starling serve --port {port} --max-model-len {max_model_len} \
             --kv-cache-memory {kv_cache_memory_bytes} --kv-compression '{\"method\":\"none\"}'",
        )
        .unwrap();
        assert_eq!(spec.name, "plain");
        assert!(spec.takes_max_model_len() && spec.takes_kv_memory());
        let line = spec.render(BootParams {
            port: 8101,
            max_model_len_tokens: 4096,
            kv_cache_memory_bytes: 1 << 30,
        });
        assert_eq!(
            line,
            "starling serve --port 8101 --max-model-len 4096 --kv-cache-memory 1073741824 \
             --kv-compression '{\"method\":\"none\"}'"
        );
        let fixed =
            EngineSpec::parse("vllm=python3 -m x --port {port} --max-model-len 8192").unwrap();
        assert!(!fixed.takes_max_model_len() && !fixed.takes_kv_memory());
    }

    #[test]
    fn bad_specs_are_refused() {
        for bad in [
            "no-equals-sign",
            "=starling serve --port {port}",
            "a b=starling serve --port {port}",
            "../x=starling serve --port {port}",
            "plain=starling serve --port 8000",
        ] {
            assert!(EngineSpec::parse(bad).is_err(), "{bad}");
        }
    }
}
