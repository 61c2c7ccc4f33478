//! The engine's side of a kernel profile: start one on the backend (recorded decode steps are
//! dropped, since launches inside a graph are not timed) and read its per-site totals.

use starling_backend::{Backend, KernelSiteTime};

use super::{Engine, EngineError};

impl<B: Backend> Engine<B> {
    /// Starts timing every device launch by site, from zero; decode steps run eager from now on
    /// (any recorded decode graphs are dropped). Returns whether the backend can profile
    /// (`false` on the CPU, which then runs as before).
    pub fn start_kernel_profile(&mut self) -> Result<bool, EngineError> {
        if !self.backend.start_kernel_profile()? {
            return Ok(false);
        }
        self.graphs = None;
        Ok(true)
    }

    /// Device time per launch site since [`Engine::start_kernel_profile`] (launches that have
    /// completed), longest first; empty when no profile runs.
    pub fn kernel_profile(&self) -> Result<Vec<KernelSiteTime>, EngineError> {
        Ok(self.backend.kernel_profile()?)
    }
}
