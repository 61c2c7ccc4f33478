//! What every handler shares.

use std::sync::Arc;

use starling_models::chat::ChatTemplate;
use starling_models::tokenizer::Tokenizer;

use crate::engine_thread::EngineHandle;

/// How the served model is presented at `/v1/models` and checked against `model` fields. Where
/// the weights live is deliberately absent: clients never see a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// The name clients must use (`--served-model-name`, else the `--model` alias or file name).
    pub served_name: String,
    /// Unix time the server started, seconds (the model's `created`).
    pub created_unix_s: u64,
}

/// Shared state of the router.
#[derive(Clone)]
pub struct AppState {
    /// The engine thread.
    pub engine: EngineHandle,
    /// Encodes prompts, decodes logprob tokens, backs `/tokenize`.
    pub tokenizer: Arc<Tokenizer>,
    /// The model's chat template; `None` makes chat requests a 400.
    pub chat_template: Option<Arc<ChatTemplate>>,
    /// The served model's identity.
    pub model: Arc<ModelInfo>,
}

impl AppState {
    /// A 404 unless `requested` is absent or names the served model.
    pub fn check_model(&self, requested: Option<&str>) -> Result<(), crate::ApiError> {
        match requested {
            Some(name) if name != self.model.served_name => Err(crate::ApiError::model_not_found(
                name,
                &self.model.served_name,
            )),
            _ => Ok(()),
        }
    }
}
