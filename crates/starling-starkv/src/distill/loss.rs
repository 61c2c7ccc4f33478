//! The distillation loss: mean KL(teacher ‖ student) over next-token distributions.

use candle_core::{Tensor, D};

use super::DistillError;

/// Row-wise `log softmax` of `logits [T, vocab]`.
pub(crate) fn log_softmax(logits: &Tensor) -> Result<Tensor, DistillError> {
    // The max is a constant shift of each row: detaching it changes no gradient.
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(shifted.broadcast_sub(&log_sum)?)
}

/// `mean_t Σ_v p_t(v) (log p_t(v) − log q_t(v))` with `teacher` and `student` log
/// probabilities `[T, vocab]`; the teacher is a constant.
pub(crate) fn mean_kl(teacher: &Tensor, student: &Tensor) -> Result<Tensor, DistillError> {
    let rows = teacher.dim(0)?;
    let teacher = teacher.detach();
    let p = teacher.exp()?;
    let kl = (p * (teacher - student)?)?.sum_all()?;
    Ok((kl / rows.max(1) as f64)?)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn kl_is_zero_for_equal_rows_and_matches_a_hand_value() {
        let device = Device::Cpu;
        let a = Tensor::new(&[[1.0f32, 2.0, 3.0], [0.0, 0.0, 0.0]], &device).unwrap();
        let la = log_softmax(&a).unwrap();
        let zero = mean_kl(&la, &la).unwrap().to_scalar::<f32>().unwrap();
        assert!(zero.abs() < 1e-7);
        // Row 2 of b puts the mass differently: KL(uniform ‖ softmax(0, 0, ln 2)).
        let b = Tensor::new(&[[1.0f32, 2.0, 3.0], [0.0, 0.0, 2f32.ln()]], &device).unwrap();
        let lb = log_softmax(&b).unwrap();
        let got = mean_kl(&la, &lb).unwrap().to_scalar::<f32>().unwrap();
        // q = (1/4, 1/4, 1/2): KL = (1/3)(ln(4/3) · 2 + ln(2/3)), averaged over 2 rows.
        let want = ((2.0 * (4.0f64 / 3.0).ln() + (2.0f64 / 3.0).ln()) / 3.0) / 2.0;
        assert!((f64::from(got) - want).abs() < 1e-6, "{got} vs {want}");
    }
}
