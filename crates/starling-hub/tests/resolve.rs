//! The rules by which `--model` arguments are resolved.

use std::fs;
use std::path::Path;

use starling_hub::{resolve_model, FetchOptions, HubError, ModelLocation};

fn options(home: &Path) -> FetchOptions {
    let mut options = FetchOptions::new(home.to_path_buf());
    // Resolution of paths must never run pip; a missing interpreter would surface as an error.
    options.python = home.join("no-such-python").into_os_string();
    options.show_progress = false;
    options
}

#[test]
fn gguf_file_resolves_to_gguf() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("model.gguf");
    fs::write(&file, b"GGUF\x03\x00\x00\x00rest").unwrap();
    let arg = file.to_str().unwrap();
    assert_eq!(
        resolve_model(arg, &options(root.path())).unwrap(),
        ModelLocation::Gguf(file.clone())
    );
}

#[test]
fn non_gguf_file_is_rejected_clearly() {
    let root = tempfile::tempdir().unwrap();
    for content in [&b"PK\x03\x04zip"[..], &b"GG"[..], &b""[..]] {
        let file = root.path().join("weights.bin");
        fs::write(&file, content).unwrap();
        let err = resolve_model(file.to_str().unwrap(), &options(root.path())).unwrap_err();
        assert!(matches!(err, HubError::NotGguf { .. }), "{err:?}");
        assert!(err.to_string().contains("GGUF"));
    }
}

#[test]
fn complete_hf_dir_resolves_to_hf_dir() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("my-model");
    fs::create_dir_all(&dir).unwrap();
    for name in [
        "config.json",
        "tokenizer.json",
        "model-00001-of-00002.safetensors",
    ] {
        fs::write(dir.join(name), b"{}").unwrap();
    }
    assert_eq!(
        resolve_model(dir.to_str().unwrap(), &options(root.path())).unwrap(),
        ModelLocation::HfDir(dir.clone())
    );
}

#[test]
fn incomplete_hf_dir_names_what_is_missing() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("half-model");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("config.json"), b"{}").unwrap();
    let err = resolve_model(dir.to_str().unwrap(), &options(root.path())).unwrap_err();
    match &err {
        HubError::HfDirIncomplete { missing, .. } => {
            assert_eq!(missing, &["*.safetensors", "tokenizer.json"])
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("tokenizer.json"));

    fs::write(dir.join("model.safetensors"), b"").unwrap();
    let err = resolve_model(dir.to_str().unwrap(), &options(root.path())).unwrap_err();
    match err {
        HubError::HfDirIncomplete { missing, .. } => assert_eq!(missing, ["tokenizer.json"]),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn anything_else_lists_the_aliases() {
    let root = tempfile::tempdir().unwrap();
    let empty_dir = root.path().join("empty");
    fs::create_dir_all(&empty_dir).unwrap();
    let missing = root.path().join("missing.gguf");
    for arg in [
        "llama-9000",
        empty_dir.to_str().unwrap(),
        missing.to_str().unwrap(),
    ] {
        let err = resolve_model(arg, &options(root.path())).unwrap_err();
        assert!(matches!(err, HubError::UnknownModel { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains("smollm2-135m"), "{message}");
        assert!(message.contains("qwen2.5-coder-0.5b"), "{message}");
    }
}

#[test]
fn alias_resolves_through_the_cache() {
    let root = tempfile::tempdir().unwrap();
    let options = options(root.path());
    let source = options.registry.get("smollm2-135m").unwrap().clone();
    // Plant a file with the right size and a marker vouching for it: resolve must return it
    // without hashing or running pip (the interpreter does not exist).
    let dir = root.path().join("models/smollm2-135m");
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join(&source.file_name);
    let file = fs::File::create(&path).unwrap();
    file.set_len(source.size_bytes).unwrap();
    fs::write(
        dir.join(format!("{}.sha256", source.file_name)),
        format!("{} {}\n", source.sha256, source.size_bytes),
    )
    .unwrap();
    assert_eq!(
        resolve_model("smollm2-135m", &options).unwrap(),
        ModelLocation::Gguf(path)
    );
}
