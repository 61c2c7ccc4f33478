//! The kept factors of every compressed layer as candle variables (refinement's parameters),
//! the K/V weights they stand for, and the way back to [`ModelProjections`] in the checkpoint's
//! layout. Ranks are the projections' own and never change.

use candle_core::{Device, Tensor, Var};

use crate::distill::frozen::KvWeights;
use crate::distill::DistillError;
use crate::{KvShape, LayerProjections, Matrix, ModelProjections};

/// One compressed layer's matrices, as in [`LayerProjections`].
struct LayerVars {
    /// `A_h = diag(σ) R_h[:r_h]`, `[r_h, hidden]`, per KV head.
    key_down: Vec<Var>,
    /// `B_h = U_h[:, :r_h]`, `[head_dim, r_h]`, per KV head.
    key_up: Vec<Var>,
    /// `A_v`, `[r_v, hidden]`.
    value_down: Var,
    /// `B_v`, `[kv_size, r_v]`.
    value_up: Var,
}

/// Every compressed layer's matrices as variables (`None`: uncompressed layer).
pub(super) struct ProjectionVars {
    shape: KvShape,
    layers: Vec<Option<LayerVars>>,
}

fn var(matrix: &Matrix) -> Result<Var, DistillError> {
    let tensor = Tensor::from_slice(matrix.data(), (matrix.rows(), matrix.cols()), &Device::Cpu)?;
    Ok(Var::from_tensor(&tensor)?)
}

fn matrix(var: &Var) -> Result<Matrix, DistillError> {
    let (rows, cols) = var.as_tensor().dims2()?;
    let data = var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
    Ok(Matrix::new(rows, cols, data)?)
}

impl ProjectionVars {
    /// Variables holding copies of `projections`' matrices.
    pub(super) fn new(projections: &ModelProjections) -> Result<Self, DistillError> {
        let layers = projections
            .layers()
            .iter()
            .map(|p| {
                p.as_ref()
                    .map(|p| -> Result<LayerVars, DistillError> {
                        Ok(LayerVars {
                            key_down: p.key_down.iter().map(var).collect::<Result<_, _>>()?,
                            key_up: p.key_up.iter().map(var).collect::<Result<_, _>>()?,
                            value_down: var(&p.value_down)?,
                            value_up: var(&p.value_up)?,
                        })
                    })
                    .transpose()
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            shape: *projections.shape(),
            layers,
        })
    }

    /// Every variable, layer by layer: per key head `A_h` then `B_h`, then `A_v`, `B_v`. The
    /// order is fixed, so optimiser state lines up from step to step.
    pub(super) fn all(&self) -> Vec<&Var> {
        let mut out = Vec::new();
        for layer in self.layers.iter().flatten() {
            for (down, up) in layer.key_down.iter().zip(&layer.key_up) {
                out.push(down);
                out.push(up);
            }
            out.push(&layer.value_down);
            out.push(&layer.value_up);
        }
        out
    }

    /// Per layer, the K/V weights `[B_0 A_0; B_1 A_1; …]` and `B_v A_v` the variables stand
    /// for (graph nodes: their gradient reaches every variable); `None` when uncompressed.
    pub(super) fn kv_weights(&self) -> Result<Vec<Option<KvWeights>>, DistillError> {
        self.layers
            .iter()
            .map(|layer| {
                layer
                    .as_ref()
                    .map(|l| -> Result<KvWeights, DistillError> {
                        // Ranks differ between heads, so heads are multiplied one by one.
                        let heads = l
                            .key_up
                            .iter()
                            .zip(&l.key_down)
                            .map(|(up, down)| up.as_tensor().matmul(down.as_tensor()))
                            .collect::<Result<Vec<_>, _>>()?;
                        Ok(KvWeights {
                            key: Tensor::cat(&heads, 0)?,
                            value: l.value_up.as_tensor().matmul(l.value_down.as_tensor())?,
                        })
                    })
                    .transpose()
            })
            .collect()
    }

    /// The current values as projections, in the layout (and at the ranks) they came in.
    pub(super) fn projections(&self) -> Result<ModelProjections, DistillError> {
        let layers = self
            .layers
            .iter()
            .map(|layer| {
                layer
                    .as_ref()
                    .map(|l| -> Result<LayerProjections, DistillError> {
                        Ok(LayerProjections {
                            key_down: l.key_down.iter().map(matrix).collect::<Result<_, _>>()?,
                            key_up: l.key_up.iter().map(matrix).collect::<Result<_, _>>()?,
                            value_down: matrix(&l.value_down)?,
                            value_up: matrix(&l.value_up)?,
                        })
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ModelProjections::new(self.shape, layers)?)
    }
}
