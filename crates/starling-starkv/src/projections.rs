//! The truncated factors a checkpoint holds, and the host reference of what the cache does with
//! them: project a layer's input to latents (what is cached), reconstruct K/V from latents.

use crate::{KvShape, LayerRanks, Matrix, ModelFactors, RankAllocation, StarKvError};

/// The projections of one compressed layer.
///
/// Keys: the cached latent of head `h` is `x A_hᵀ` (`A_h` `[r_h, hidden]`, pre-RoPE); the
/// head's keys are `latent B_hᵀ + b_h` (`B_h` `[head_dim, r_h]`), then RoPE at the token's
/// position. Values: one latent `x A_vᵀ` (`A_v` `[r_v, hidden]`) for all heads, values
/// `latent B_vᵀ + b_v` (`B_v` `[kv_heads · head_dim, r_v]`). Biases are the model's own.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerProjections {
    /// `A_h` per KV head.
    pub key_down: Vec<Matrix>,
    /// `B_h` per KV head.
    pub key_up: Vec<Matrix>,
    /// `A_v`.
    pub value_down: Matrix,
    /// `B_v`.
    pub value_up: Matrix,
}

impl LayerProjections {
    /// The ranks these projections have.
    pub fn ranks(&self) -> LayerRanks {
        LayerRanks {
            key_ranks: self.key_down.iter().map(Matrix::rows).collect(),
            value_rank: self.value_down.rows(),
        }
    }

    /// Fails unless every matrix has the shape `shape` and `ranks` imply.
    pub fn check_shapes(&self, shape: &KvShape, ranks: &LayerRanks) -> Result<(), StarKvError> {
        let heads = shape.num_kv_heads;
        if self.key_down.len() != heads || self.key_up.len() != heads {
            return Err(StarKvError::SizeMismatch {
                what: "key projections".to_owned(),
                expected: heads,
                found: self.key_down.len().min(self.key_up.len()),
            });
        }
        let mut expected = Vec::new();
        for (head, &rank) in ranks.key_ranks.iter().enumerate() {
            let what = format!("key head {head}");
            expected.push((
                what.clone(),
                &self.key_down[head],
                [rank, shape.hidden_size],
            ));
            expected.push((what, &self.key_up[head], [shape.head_dim, rank]));
        }
        let rank = ranks.value_rank;
        expected.push((
            "value".to_owned(),
            &self.value_down,
            [rank, shape.hidden_size],
        ));
        expected.push(("value".to_owned(), &self.value_up, [shape.kv_size(), rank]));
        for (what, matrix, want) in expected {
            if matrix.shape() != want {
                return Err(StarKvError::InvalidArgument(format!(
                    "{what} projection is {:?}, expected {want:?}",
                    matrix.shape()
                )));
            }
        }
        Ok(())
    }

    /// `[B_0 A_0; B_1 A_1; …]`, the `W_k` `[kv_size, hidden]` these projections stand for.
    pub fn reconstructed_key_weight(&self) -> Result<Matrix, StarKvError> {
        let mut data = Vec::new();
        let mut rows = 0;
        let mut cols = 0;
        for (up, down) in self.key_up.iter().zip(&self.key_down) {
            let head = up.matmul(down)?;
            rows += head.rows();
            cols = head.cols();
            data.extend_from_slice(head.data());
        }
        Matrix::new(rows, cols, data)
    }

    /// `B_v A_v`, the `W_v` these projections stand for.
    pub fn reconstructed_value_weight(&self) -> Result<Matrix, StarKvError> {
        self.value_up.matmul(&self.value_down)
    }

    /// The cached key latents of the rows of `x` (`[tokens, hidden]`): one `[tokens, r_h]`
    /// matrix per KV head.
    pub fn key_latents(&self, x: &Matrix) -> Result<Vec<Matrix>, StarKvError> {
        self.key_down
            .iter()
            .map(|down| x.matmul(&down.transpose()))
            .collect()
    }

    /// Pre-RoPE keys `[tokens, kv_size]` from per-head latents, plus the model's key bias.
    pub fn keys_from_latents(
        &self,
        latents: &[Matrix],
        bias: Option<&[f32]>,
    ) -> Result<Matrix, StarKvError> {
        if latents.len() != self.key_up.len() {
            return Err(StarKvError::SizeMismatch {
                what: "key latents".to_owned(),
                expected: self.key_up.len(),
                found: latents.len(),
            });
        }
        let heads = latents
            .iter()
            .zip(&self.key_up)
            .map(|(latent, up)| latent.matmul(&up.transpose()))
            .collect::<Result<Vec<_>, _>>()?;
        let tokens = heads.first().map_or(0, Matrix::rows);
        let head_dim = heads.first().map_or(0, Matrix::cols);
        let width = head_dim * heads.len();
        let mut data = Vec::with_capacity(tokens * width);
        for t in 0..tokens {
            for head in &heads {
                data.extend_from_slice(head.row(t));
            }
        }
        add_bias(Matrix::new(tokens, width, data)?, bias)
    }

    /// The cached value latent `[tokens, r_v]` of the rows of `x`.
    pub fn value_latent(&self, x: &Matrix) -> Result<Matrix, StarKvError> {
        x.matmul(&self.value_down.transpose())
    }

    /// Values `[tokens, kv_size]` from the latent, plus the model's value bias.
    pub fn values_from_latent(
        &self,
        latent: &Matrix,
        bias: Option<&[f32]>,
    ) -> Result<Matrix, StarKvError> {
        add_bias(latent.matmul(&self.value_up.transpose())?, bias)
    }
}

fn add_bias(matrix: Matrix, bias: Option<&[f32]>) -> Result<Matrix, StarKvError> {
    let Some(bias) = bias else {
        return Ok(matrix);
    };
    if bias.len() != matrix.cols() {
        return Err(StarKvError::SizeMismatch {
            what: "bias".to_owned(),
            expected: matrix.cols(),
            found: bias.len(),
        });
    }
    let (rows, cols) = (matrix.rows(), matrix.cols());
    let mut data = matrix.into_data();
    for row in data.chunks_mut(cols) {
        for (x, b) in row.iter_mut().zip(bias) {
            *x += b;
        }
    }
    Matrix::new(rows, cols, data)
}

/// The projections of every layer (`None`: uncompressed), with the shape they fit.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelProjections {
    shape: KvShape,
    layers: Vec<Option<LayerProjections>>,
}

impl ModelProjections {
    /// Truncates `factors` to the ranks of `allocation` (which must cover the same layers).
    pub fn from_factors(
        factors: &ModelFactors,
        allocation: &RankAllocation,
    ) -> Result<Self, StarKvError> {
        let shape = factors.shape();
        if *allocation.shape() != shape {
            return Err(StarKvError::InvalidArgument(format!(
                "allocation for {:?} applied to factors of {shape:?}",
                allocation.shape()
            )));
        }
        let mut layers = Vec::with_capacity(shape.num_layers);
        for layer in 0..shape.num_layers {
            let projections = match (factors.layer(layer), allocation.layer(layer)) {
                (None, None) => None,
                (Some(f), Some(ranks)) => {
                    let keys = f.keys.iter().zip(&ranks.key_ranks);
                    Some(LayerProjections {
                        key_down: keys
                            .clone()
                            .map(|(k, &r)| k.down_projection(r))
                            .collect::<Result<_, _>>()?,
                        key_up: keys
                            .map(|(k, &r)| k.up_projection(r))
                            .collect::<Result<_, _>>()?,
                        value_down: f.value.down_projection(ranks.value_rank)?,
                        value_up: f.value.up_projection(ranks.value_rank)?,
                    })
                }
                _ => {
                    return Err(StarKvError::InvalidArgument(format!(
                        "layer {layer} is compressed in only one of the factors and the \
                         allocation"
                    )))
                }
            };
            layers.push(projections);
        }
        Self::new(shape, layers)
    }

    /// Checks every layer's matrices against `shape` (ranks in range, shapes consistent).
    pub fn new(shape: KvShape, layers: Vec<Option<LayerProjections>>) -> Result<Self, StarKvError> {
        let ranks = layers
            .iter()
            .map(|l| l.as_ref().map(LayerProjections::ranks))
            .collect();
        let allocation = RankAllocation::new(shape, ranks)?;
        for (layer, projections) in layers.iter().enumerate() {
            if let (Some(p), Some(r)) = (projections, allocation.layer(layer)) {
                p.check_shapes(&shape, r)
                    .map_err(|e| StarKvError::InvalidArgument(format!("layer {layer}: {e}")))?;
            }
        }
        Ok(Self { shape, layers })
    }

    /// The model shape.
    pub fn shape(&self) -> &KvShape {
        &self.shape
    }

    /// Per layer, its projections or `None` when uncompressed.
    pub fn layers(&self) -> &[Option<LayerProjections>] {
        &self.layers
    }

    /// The rank allocation these projections realise.
    pub fn allocation(&self) -> Result<RankAllocation, StarKvError> {
        let ranks = self
            .layers
            .iter()
            .map(|l| l.as_ref().map(LayerProjections::ranks))
            .collect();
        RankAllocation::new(self.shape, ranks)
    }
}

#[cfg(test)]
mod tests {
    use starling_models::{synthetic_weights, LayerTensor, ModelConfig};

    use super::*;
    use crate::UncompressedLayers;

    #[test]
    fn full_rank_projections_reproduce_keys_and_values_with_biases() {
        let mut config = ModelConfig::tiny_llama_for_tests();
        config.attention_bias = true;
        let weights = synthetic_weights(&config, 11);
        let none = UncompressedLayers::none();
        let factors = ModelFactors::compute(&config, &weights, &none, None).unwrap();
        let shape = factors.shape();
        let full = LayerRanks {
            key_ranks: vec![shape.max_key_rank(); 2],
            value_rank: shape.max_value_rank(),
        };
        let allocation = RankAllocation::new(shape, vec![Some(full.clone()); 2]).unwrap();
        let projections = ModelProjections::from_factors(&factors, &allocation).unwrap();
        let layer = projections.layers()[1].as_ref().unwrap();
        assert_eq!(layer.ranks(), full);

        let get = |t: LayerTensor| weights.get(&t.name(1)).unwrap().data().to_vec();
        let w_k = Matrix::new(32, 64, get(LayerTensor::KProj)).unwrap();
        let w_v = Matrix::new(32, 64, get(LayerTensor::VProj)).unwrap();
        let (b_k, b_v) = (get(LayerTensor::KBias), get(LayerTensor::VBias));
        let x = Matrix::new(
            3,
            64,
            (0..192)
                .map(|i| ((i * 37) % 17) as f32 / 17.0 - 0.5)
                .collect(),
        )
        .unwrap();
        let with_bias = |y: Matrix, b: &[f32]| add_bias(y, Some(b)).unwrap();
        let want_k = with_bias(x.matmul(&w_k.transpose()).unwrap(), &b_k);
        let want_v = with_bias(x.matmul(&w_v.transpose()).unwrap(), &b_v);

        let latents = layer.key_latents(&x).unwrap();
        assert_eq!(latents[0].shape(), [3, 16]);
        let keys = layer.keys_from_latents(&latents, Some(&b_k)).unwrap();
        let values = layer
            .values_from_latent(&layer.value_latent(&x).unwrap(), Some(&b_v))
            .unwrap();
        assert!(keys.distance_sq(&want_k).unwrap() < 1e-9 * want_k.frobenius_sq());
        assert!(values.distance_sq(&want_v).unwrap() < 1e-9 * want_v.frobenius_sq());
        let w_k_back = layer.reconstructed_key_weight().unwrap();
        assert!(w_k_back.distance_sq(&w_k).unwrap() < 1e-10 * w_k.frobenius_sq());
    }

    #[test]
    fn inconsistent_shapes_are_refused() {
        let shape = KvShape {
            hidden_size: 4,
            num_layers: 1,
            num_kv_heads: 1,
            head_dim: 2,
        };
        let layer = LayerProjections {
            key_down: vec![Matrix::zeros(1, 4)],
            key_up: vec![Matrix::zeros(2, 2)],
            value_down: Matrix::zeros(1, 4),
            value_up: Matrix::zeros(2, 1),
        };
        let err = ModelProjections::new(shape, vec![Some(layer)]).unwrap_err();
        assert!(err.to_string().contains("key head 0"), "{err}");
    }
}
