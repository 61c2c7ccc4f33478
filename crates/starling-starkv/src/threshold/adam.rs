//! Adam (Kingma & Ba 2015) for a handful of parameters, with the usual bias correction.

/// Adam's state for a fixed number of parameters.
#[derive(Clone, Debug)]
pub(crate) struct Adam {
    learning_rate: f64,
    beta1: f64,
    beta2: f64,
    epsilon: f64,
    first: Vec<f64>,
    second: Vec<f64>,
    step: i32,
}

impl Adam {
    /// Default betas (0.9, 0.999) and ε = 1e-8.
    pub(crate) fn new(num_params: usize, learning_rate: f64) -> Self {
        Self {
            learning_rate,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            first: vec![0.0; num_params],
            second: vec![0.0; num_params],
            step: 0,
        }
    }

    /// One update of `params` against `grads` (descent).
    pub(crate) fn step(&mut self, params: &mut [f64], grads: &[f64]) {
        self.step = self.step.saturating_add(1);
        let correct1 = 1.0 - self.beta1.powi(self.step);
        let correct2 = 1.0 - self.beta2.powi(self.step);
        for (((p, &g), m), v) in params
            .iter_mut()
            .zip(grads)
            .zip(&mut self.first)
            .zip(&mut self.second)
        {
            *m = self.beta1 * *m + (1.0 - self.beta1) * g;
            *v = self.beta2 * *v + (1.0 - self.beta2) * g * g;
            let m_hat = *m / correct1;
            let v_hat = *v / correct2;
            *p -= self.learning_rate * m_hat / (v_hat.sqrt() + self.epsilon);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimises_a_quadratic() {
        // f(x, y) = (x − 3)² + 10 (y + 1)².
        let mut params = [0.0, 0.0];
        let mut adam = Adam::new(2, 0.05);
        for _ in 0..2000 {
            let grads = [2.0 * (params[0] - 3.0), 20.0 * (params[1] + 1.0)];
            adam.step(&mut params, &grads);
        }
        assert!((params[0] - 3.0).abs() < 1e-3, "{params:?}");
        assert!((params[1] + 1.0).abs() < 1e-3, "{params:?}");
    }
}
