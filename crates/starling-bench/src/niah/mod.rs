//! Needle in a haystack (`starling bench niah`), the engine-free parts: the grid, haystacks of
//! exact token length with the needle at a depth, the prompt, scoring, result records, the
//! markdown summary, heatmaps, the agreement with HF transformers, and the side-by-side with
//! NVIDIA kvpress.
//!
//! Conventions (kvpress and the original test): the needle and question of [`NEEDLE`] and
//! [`QUESTION`], the haystack made of the Paul Graham essays, the needle at `depth%` of the
//! haystack's tokens at a sentence start, greedy answers; an answer scores the share of
//! [`NEEDLE_FACTS`] it states, plus ROUGE-L recall of the needle.

mod grid;
mod haystack;
mod heatmap;
mod hf_compare;
mod kvpress;
mod prompt;
mod report;
mod score;

pub use grid::{
    check_depths, context_label, parse_context_tokens, parse_methods, MethodSpec, TOKENS_PER_K,
};
pub use haystack::{Haystack, HaystackSource};
pub use heatmap::{
    mean_label, score_color, write_heatmap_pair_png, write_heatmap_png, HeatmapGrid,
};
pub use hf_compare::{
    agreement_markdown, compare_with_hf, AgreementRow, HfAnswers, HfCell, PromptCell, PromptDump,
};
pub use kvpress::{
    compare_with_kvpress, comparison_markdown, kvpress_grid, write_ratio_chart_png, ComparisonRow,
    KvpressAnswers, KvpressCell,
};
pub use prompt::{
    messages, split_at_placeholder, Message, NiahProtocol, CONTEXT_PLACEHOLDER, NEEDLE,
    NEEDLE_INSERT, QUESTION, SYSTEM_PROMPT,
};
pub use report::{MethodRun, NiahCell, NiahReport};
pub use score::{fact_score, lcs_len, rouge_l_recall, word_tokens, NEEDLE_FACTS};
