//! Row ops on the GPU (kernels in `kernels/ops.cu`): embedding and row gathers, RMSNorm and the
//! fused add + RMSNorm, the residual add, SwiGLU. One block per row where a row is the unit,
//! grid-stride loops for the elementwise ones.

use cudarc::driver::CudaFunction;
use starling_backend::{BackendError, ModelOps};

use super::{err, grid_for, row_chunk_threads, rows_config, CudaBackend, CudaBatch};
use crate::{CudaError, CudaTensor, DeviceBuf};

impl CudaBackend {
    /// [`ModelOps::embedding`]: the rows of `table` for `ids`.
    pub(super) fn embedding_impl(
        &self,
        table: &CudaTensor,
        ids: &[u32],
    ) -> Result<CudaTensor, BackendError> {
        let (vocab, d) = table.matrix_dims().map_err(err)?;
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
            return Err(BackendError::Shape(format!(
                "token id {bad} outside a vocabulary of {vocab}"
            )));
        }
        self.gather_rows(table, ids).map(|mut t| {
            t.set_shape(vec![ids.len(), d]);
            t
        })
    }

    /// [`ModelOps::embedding_for_batch`]: from a replay batch's device ids, else as `embedding`.
    pub(super) fn embedding_for_batch_impl(
        &self,
        table: &CudaTensor,
        ids: &[u32],
        batch: &CudaBatch,
    ) -> Result<CudaTensor, BackendError> {
        if batch.replay.is_none() {
            return self.embedding(table, ids);
        }
        // A replay batch holds the step's ids (checked against the vocabulary by the runner).
        let (vocab, d) = table.matrix_dims().map_err(err)?;
        let rows = batch.meta.num_tokens();
        if ids.len() != rows || vocab == 0 {
            return Err(BackendError::Shape(format!(
                "embedding: {} ids for a replay batch of {rows} rows",
                ids.len()
            )));
        }
        let mut out = self.alloc_bf16(rows * d).map_err(err)?;
        let d_i = d as i32;
        launch!(
            self,
            &self.kernels.gather_rows,
            rows_config(rows, row_chunk_threads(d)),
            table.bf16().map_err(err)?,
            &batch.token_ids(),
            &mut out,
            &d_i
        )
        .map_err(err)?;
        Ok(self.tensor(DeviceBuf::Bf16(out), vec![rows, d]))
    }

    /// [`ModelOps::rms_norm`].
    pub(super) fn rms_norm_impl(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor, BackendError> {
        let (rows, d) = x.matrix_dims().map_err(err)?;
        if w.numel() != d {
            return Err(BackendError::Shape(format!(
                "rms_norm: weight of {} for rows of {d}",
                w.numel()
            )));
        }
        let mut out = self.alloc_bf16(rows * d).map_err(err)?;
        if rows == 0 {
            return Ok(self.tensor(DeviceBuf::Bf16(out), x.shape().to_vec()));
        }
        let d_i = d as i32;
        launch!(
            self,
            &self.kernels.rms_norm,
            rows_config(rows, row_chunk_threads(d)),
            x.bf16().map_err(err)?,
            w.bf16().map_err(err)?,
            &mut out,
            &d_i,
            &eps
        )
        .map_err(err)?;
        Ok(self.tensor(DeviceBuf::Bf16(out), x.shape().to_vec()))
    }

    /// [`ModelOps::add_rms_norm`]: `residual += delta`, then its RMSNorm.
    pub(super) fn add_rms_norm_impl(
        &self,
        residual: &mut CudaTensor,
        delta: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor, BackendError> {
        let (rows, d) = residual.matrix_dims().map_err(err)?;
        if delta.shape() != residual.shape() || w.numel() != d {
            return Err(BackendError::Shape(format!(
                "add_rms_norm: {:?} + {:?}, weight {}",
                residual.shape(),
                delta.shape(),
                w.numel()
            )));
        }
        let mut out = self.alloc_bf16(rows * d).map_err(err)?;
        let d_i = d as i32;
        let shape = residual.shape().to_vec();
        if rows == 0 {
            return Ok(self.tensor(DeviceBuf::Bf16(out), shape));
        }
        let (db, wb) = (delta.bf16().map_err(err)?, w.bf16().map_err(err)?);
        let rb = residual.bf16_mut().map_err(err)?;
        launch!(
            self,
            &self.kernels.add_rms_norm,
            rows_config(rows, row_chunk_threads(d)),
            rb,
            db,
            wb,
            &mut out,
            &d_i,
            &eps
        )
        .map_err(err)?;
        Ok(self.tensor(DeviceBuf::Bf16(out), shape))
    }

    /// [`ModelOps::add_inplace`].
    pub(super) fn add_inplace_impl(
        &self,
        x: &mut CudaTensor,
        delta: &CudaTensor,
    ) -> Result<(), BackendError> {
        if x.shape() != delta.shape() {
            return Err(BackendError::Shape(format!(
                "add: {:?} vs {:?}",
                x.shape(),
                delta.shape()
            )));
        }
        let n = x.numel();
        let db = delta.bf16().map_err(err)?;
        let xb = x.bf16_mut().map_err(err)?;
        launch!(self, &self.kernels.add_inplace, grid_for(n), xb, db, &n).map_err(err)
    }

    /// [`ModelOps::silu_mul`] and [`ModelOps::gelu_tanh_mul`]: `kernel` is the activation's
    /// gated-multiply kernel (ops.cu).
    pub(super) fn gated_mul_impl(
        &self,
        gate_up: &CudaTensor,
        kernel: &CudaFunction,
        what: &str,
    ) -> Result<CudaTensor, BackendError> {
        let (rows, two_f) = gate_up.matrix_dims().map_err(err)?;
        if two_f % 2 != 0 {
            return Err(BackendError::Shape(format!("{what}: odd width {two_f}")));
        }
        let f = two_f / 2;
        let mut out = self.alloc_bf16(rows * f).map_err(err)?;
        let f_i = f as i32;
        launch!(
            self,
            kernel,
            // One thread per 16-byte chunk of outputs where the rows are chunked (ops.cu).
            grid_for(if f % 8 == 0 { rows * f / 8 } else { rows * f }),
            gate_up.bf16().map_err(err)?,
            &mut out,
            &rows,
            &f_i
        )
        .map_err(err)?;
        Ok(self.tensor(DeviceBuf::Bf16(out), vec![rows, f]))
    }

    /// [`ModelOps::scale_inplace`].
    pub(super) fn scale_inplace_impl(
        &self,
        x: &mut CudaTensor,
        factor: f32,
    ) -> Result<(), BackendError> {
        let n = x.numel();
        let xb = x.bf16_mut().map_err(err)?;
        launch!(self, &self.kernels.scale, grid_for(n), xb, &n, &factor).map_err(err)
    }

    /// [`ModelOps::gather_rows`].
    pub(super) fn gather_rows_impl(
        &self,
        x: &CudaTensor,
        rows: &[u32],
    ) -> Result<CudaTensor, BackendError> {
        let (n, d) = x.matrix_dims().map_err(err)?;
        if let Some(bad) = rows.iter().find(|&&r| r as usize >= n) {
            return Err(BackendError::Shape(format!("row {bad} outside {n} rows")));
        }
        if rows.len() == n && rows.iter().enumerate().all(|(i, &r)| r as usize == i) {
            // Every row in order (decode steps' logits rows): a device copy, no index upload,
            // so a recorded decode step can contain it.
            // Through `alloc_bf16`, so that a recorded step holds no memory node here.
            let mut copy = self.alloc_bf16(n * d).map_err(err)?;
            self.stream
                .memcpy_dtod(&x.bf16().map_err(err)?.slice(..n * d), &mut copy)
                .map_err(err)?;
            return Ok(self.tensor(DeviceBuf::Bf16(copy), vec![n, d]));
        }
        let ids = self.upload_u32(rows).map_err(err)?;
        let mut out = self.alloc_bf16(rows.len() * d).map_err(err)?;
        if !rows.is_empty() {
            let d_i = d as i32;
            launch!(
                self,
                &self.kernels.gather_rows,
                rows_config(rows.len(), row_chunk_threads(d)),
                x.bf16().map_err(err)?,
                &ids,
                &mut out,
                &d_i
            )
            .map_err(err)?;
        }
        Ok(self.tensor(DeviceBuf::Bf16(out), vec![rows.len(), d]))
    }
}
