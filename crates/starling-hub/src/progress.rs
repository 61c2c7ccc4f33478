//! The byte progress bar shown while a model is assembled or verified.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over `total_bytes`, drawn on stderr only when `visible` (stderr is a terminal).
pub(crate) fn byte_bar(total_bytes: u64, message: String, visible: bool) -> ProgressBar {
    let target = if visible {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(total_bytes), target);
    // The template is a constant; should it ever fail to parse, the default style is fine.
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message);
    bar
}
