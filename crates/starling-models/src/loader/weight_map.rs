//! A model's tensors by canonical name, handed out once each to the layers that own them.

use std::collections::HashMap;
use std::fmt;

use starling_backend::HostTensor;

use super::weight_names::expected_weights;
use crate::{ModelConfig, ModelError};

/// Dequantised f32 tensors keyed by canonical (HF-style) name.
#[derive(Clone, Default, PartialEq)]
pub struct WeightMap {
    tensors: HashMap<String, HostTensor>,
}

impl WeightMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a tensor, returning the one it replaced.
    pub fn insert(&mut self, name: impl Into<String>, tensor: HostTensor) -> Option<HostTensor> {
        self.tensors.insert(name.into(), tensor)
    }

    /// Removes and returns `name`, checking its shape; a mismatched tensor stays in the map.
    pub fn take(&mut self, name: &str, expected_shape: &[usize]) -> Result<HostTensor, ModelError> {
        self.check_shape(name, expected_shape)?;
        self.tensors
            .remove(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_owned(),
            })
    }

    /// Fails unless `name` is present with exactly `expected_shape`.
    pub fn check_shape(&self, name: &str, expected_shape: &[usize]) -> Result<(), ModelError> {
        let tensor = self.get(name).ok_or_else(|| ModelError::MissingTensor {
            name: name.to_owned(),
        })?;
        if tensor.shape() != expected_shape {
            return Err(ModelError::ShapeMismatch {
                name: name.to_owned(),
                expected: expected_shape.to_vec(),
                found: tensor.shape().to_vec(),
            });
        }
        Ok(())
    }

    /// Fails unless every tensor `config` implies is present with the implied shape, so that
    /// a bad checkpoint is reported at load time rather than halfway through building layers.
    pub fn check_complete(&self, config: &ModelConfig) -> Result<(), ModelError> {
        expected_weights(config).try_for_each(|(name, shape)| self.check_shape(&name, &shape))
    }

    /// The tensor called `name`, if present.
    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.tensors.get(name)
    }

    /// Whether `name` is present.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Every name, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the map holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Total number of elements across all tensors.
    pub fn num_params(&self) -> u64 {
        self.tensors.values().map(|t| t.numel() as u64).sum()
    }

    /// Consumes the map, returning the underlying name → tensor table.
    pub fn into_inner(self) -> HashMap<String, HostTensor> {
        self.tensors
    }
}

impl From<HashMap<String, HostTensor>> for WeightMap {
    fn from(tensors: HashMap<String, HostTensor>) -> Self {
        Self { tensors }
    }
}

impl FromIterator<(String, HostTensor)> for WeightMap {
    fn from_iter<I: IntoIterator<Item = (String, HostTensor)>>(iter: I) -> Self {
        Self {
            tensors: iter.into_iter().collect(),
        }
    }
}

/// Summarises instead of printing every element.
impl fmt::Debug for WeightMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeightMap")
            .field("tensors", &self.len())
            .field("params", &self.num_params())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_with(name: &str, shape: Vec<usize>) -> WeightMap {
        let mut map = WeightMap::new();
        map.insert(name, HostTensor::zeros(shape));
        map
    }

    #[test]
    fn take_removes_a_tensor_of_the_right_shape() {
        let mut map = map_with("a", vec![2, 3]);
        assert!(map.contains("a"));
        assert_eq!(map.num_params(), 6);
        let tensor = map.take("a", &[2, 3]).unwrap();
        assert_eq!(tensor.shape(), &[2, 3]);
        assert!(map.is_empty());
        assert!(matches!(
            map.take("a", &[2, 3]),
            Err(ModelError::MissingTensor { name }) if name == "a"
        ));
    }

    #[test]
    fn take_with_the_wrong_shape_reports_both_shapes_and_keeps_the_tensor() {
        let mut map = map_with("a", vec![2, 3]);
        let err = map.take("a", &[3, 2]).unwrap_err();
        assert!(matches!(
            &err,
            ModelError::ShapeMismatch { name, expected, found }
                if name == "a" && expected == &[3, 2] && found == &[2, 3]
        ));
        assert!(err.to_string().contains("`a`"));
        assert!(map.contains("a"));
    }

    #[test]
    fn names_are_sorted() {
        let mut map = map_with("b", vec![1]);
        map.insert("a", HostTensor::zeros(vec![1]));
        assert_eq!(map.names(), vec!["a", "b"]);
        assert_eq!(format!("{map:?}"), "WeightMap { tensors: 2, params: 2 }");
    }
}
