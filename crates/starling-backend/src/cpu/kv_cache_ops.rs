//! The CPU reference of the cache-management ops ([`KvCacheOps`]).

use super::{compact, key_scores, kv_transfer, latent, CpuBackend, CpuKvCache};
use crate::{
    AttentionDims, BackendError, HostTensor, KeyScoreKind, KvCacheOps, KvRows, LatentFactors,
    RopeSpec, WindowScoreSpec,
};

impl KvCacheOps for CpuBackend {
    fn copy_kv_blocks(
        &self,
        cache: &mut CpuKvCache,
        pairs: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        kv_transfer::copy_kv_blocks(cache, pairs)
    }

    fn gather_kv(
        &self,
        cache: &CpuKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
    ) -> Result<KvRows<HostTensor>, BackendError> {
        kv_transfer::gather_kv(cache, block_table, block_size_tokens, len_tokens)
    }

    fn scatter_kv(
        &self,
        cache: &mut CpuKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        rows: &KvRows<HostTensor>,
    ) -> Result<(), BackendError> {
        kv_transfer::scatter_kv(cache, block_table, block_size_tokens, rows)
    }

    fn compact_kv(
        &self,
        cache: &mut CpuKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        physical_len_tokens: usize,
        keep: &[Vec<u32>],
    ) -> Result<(), BackendError> {
        compact::compact_kv(
            cache,
            block_table,
            block_size_tokens,
            physical_len_tokens,
            keep,
        )
    }

    fn read_keys(
        &self,
        cache: &CpuKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
    ) -> Result<HostTensor, BackendError> {
        compact::read_keys(cache, block_table, block_size_tokens, len_tokens)
    }

    fn key_scores(
        &self,
        cache: &CpuKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
        kind: KeyScoreKind,
    ) -> Result<HostTensor, BackendError> {
        key_scores::key_scores(cache, block_table, block_size_tokens, len_tokens, kind)
    }

    fn window_scores(
        &self,
        cache: &CpuKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
        queries: &HostTensor,
        spec: &WindowScoreSpec,
    ) -> Result<HostTensor, BackendError> {
        key_scores::window_scores(
            cache,
            block_table,
            block_size_tokens,
            len_tokens,
            queries,
            spec,
        )
    }

    fn reconstruct_kv(
        &self,
        latent: &CpuKvCache,
        factors: &LatentFactors<'_, HostTensor>,
        dims: &AttentionDims,
        rope: &RopeSpec,
        block_table: &[u32],
        len_tokens: usize,
        dense: &mut CpuKvCache,
        dense_table: &[u32],
    ) -> Result<(), BackendError> {
        latent::reconstruct_kv(
            latent,
            factors,
            dims,
            rope,
            block_table,
            len_tokens,
            dense,
            dense_table,
        )
    }
}
