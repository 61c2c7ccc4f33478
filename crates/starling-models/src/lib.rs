//! Model configs and weight loading (GGUF and Hugging Face safetensors) for Starling, plus the
//! tokenizer and chat-template support built on them.
//!
//! Loaders hand out f32 [`starling_backend::HostTensor`]s under canonical Hugging Face names
//! (see [`loader::weight_names`]), so model code never knows which format it came from.
#![deny(missing_docs)]

pub mod config;
pub mod error;
mod latent_share;
pub mod llama;
pub mod loader;

pub use config::{
    preset, rope_inv_freqs, Architecture, MlpActivation, ModelConfig, RopeConfig, RopeScaling,
    RopeStyle, SlidingWindow, PRESET_NAMES,
};
pub use error::ModelError;
pub use loader::{
    expected_weight_shapes, load_model, synthetic_weights, GgufValue, LayerTensor, LoadedModel,
    ModelSource, WeightMap,
};

pub mod chat;
#[doc(hidden)]
pub mod fuzz;
pub mod tokenizer;
