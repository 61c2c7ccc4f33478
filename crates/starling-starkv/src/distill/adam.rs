//! Adam (Kingma & Ba 2015) on the host for the thresholds' parameters `θ`. A copy of the
//! threshold module's private optimiser (that module is not public to this one); the state is
//! a handful of numbers, so it stays on the host rather than in candle.

/// Adam's state for a fixed number of parameters: betas (0.9, 0.999), ε = 1e-8.
#[derive(Clone, Debug)]
pub(crate) struct Adam {
    learning_rate: f64,
    first: Vec<f64>,
    second: Vec<f64>,
    step: i32,
}

impl Adam {
    const BETA1: f64 = 0.9;
    const BETA2: f64 = 0.999;
    const EPSILON: f64 = 1e-8;

    pub(crate) fn new(num_params: usize, learning_rate: f64) -> Self {
        Self {
            learning_rate,
            first: vec![0.0; num_params],
            second: vec![0.0; num_params],
            step: 0,
        }
    }

    /// One descent step of `params` against `grads`, bias-corrected.
    pub(crate) fn step(&mut self, params: &mut [f64], grads: &[f64]) {
        self.step = self.step.saturating_add(1);
        let correct1 = 1.0 - Self::BETA1.powi(self.step);
        let correct2 = 1.0 - Self::BETA2.powi(self.step);
        for (((p, &g), m), v) in params
            .iter_mut()
            .zip(grads)
            .zip(&mut self.first)
            .zip(&mut self.second)
        {
            *m = Self::BETA1 * *m + (1.0 - Self::BETA1) * g;
            *v = Self::BETA2 * *v + (1.0 - Self::BETA2) * g * g;
            *p -= self.learning_rate * (*m / correct1) / ((*v / correct2).sqrt() + Self::EPSILON);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimises_a_quadratic() {
        let mut params = [0.0, 0.0];
        let mut adam = Adam::new(2, 0.05);
        for _ in 0..2000 {
            let grads = [2.0 * (params[0] - 3.0), 20.0 * (params[1] + 1.0)];
            adam.step(&mut params, &grads);
        }
        assert!((params[0] - 3.0).abs() < 1e-3 && (params[1] + 1.0).abs() < 1e-3);
    }
}
