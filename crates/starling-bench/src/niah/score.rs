//! Scoring an answer: which of the needle's facts it states, and ROUGE-L recall of the needle.

/// The needle's facts; an answer scores the share of them it contains.
pub const NEEDLE_FACTS: [&str; 3] = ["sandwich", "Dolores Park", "sunny day"];

/// Share of `facts` found in `answer` (case-insensitive substring match), in `[0, 1]`.
pub fn fact_score(answer: &str, facts: &[&str]) -> f64 {
    if facts.is_empty() {
        return 0.0;
    }
    let answer = answer.to_lowercase();
    let found = facts
        .iter()
        .filter(|fact| answer.contains(&fact.to_lowercase()))
        .count();
    found as f64 / facts.len() as f64
}

/// Lower-case word tokens: maximal runs of alphanumeric characters (as rouge-score's default
/// tokenizer, without its stemmer).
pub fn word_tokens(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Length of the longest common subsequence of two sequences.
pub fn lcs_len<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    // One row of the classic table; `diagonal` carries the previous row's value at `j − 1`.
    let mut row = vec![0usize; b.len() + 1];
    for x in a {
        let mut diagonal = 0;
        for (j, y) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if x == y {
                diagonal + 1
            } else {
                above.max(row[j])
            };
            diagonal = above;
        }
    }
    row[b.len()]
}

/// ROUGE-L recall of `candidate` against `reference`: LCS of the word tokens over the reference's
/// word count (0 for an empty reference).
pub fn rouge_l_recall(reference: &str, candidate: &str) -> f64 {
    let reference = word_tokens(reference);
    if reference.is_empty() {
        return 0.0;
    }
    let candidate = word_tokens(candidate);
    lcs_len(&reference, &candidate) as f64 / reference.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::niah::NEEDLE;

    #[test]
    fn facts_are_counted_case_insensitively() {
        let answer = "Eat a SANDWICH in dolores park.";
        assert!((fact_score(answer, &NEEDLE_FACTS) - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(fact_score(NEEDLE, &NEEDLE_FACTS), 1.0);
        assert_eq!(
            fact_score("Visit the Golden Gate Bridge.", &NEEDLE_FACTS),
            0.0
        );
        // "sunny" alone is not the fact "sunny day".
        assert_eq!(fact_score("a sunny afternoon", &NEEDLE_FACTS), 0.0);
    }

    #[test]
    fn words_are_lowercase_alphanumeric_runs() {
        assert_eq!(
            word_tokens("Eat a sandwich, sit in Dolores-Park!"),
            ["eat", "a", "sandwich", "sit", "in", "dolores", "park"]
        );
        assert!(word_tokens(" ... ").is_empty());
    }

    #[test]
    fn lcs_matches_hand_computed_values() {
        // ABCBDAB vs BDCABA: LCS 4 (e.g. BCBA), the textbook example.
        let a: Vec<char> = "ABCBDAB".chars().collect();
        let b: Vec<char> = "BDCABA".chars().collect();
        assert_eq!(lcs_len(&a, &b), 4);
        assert_eq!(lcs_len::<char>(&[], &b), 0);
        assert_eq!(lcs_len(&a, &a), 7);
    }

    #[test]
    fn rouge_l_recall_of_hand_computed_answers() {
        // Needle: 21 words. The answer's LCS with it: "eat a sandwich and sit in dolores park on
        // a sunny day" = 12 words → 12/21.
        let answer = "Eat a sandwich and sit in Dolores Park on a sunny day.";
        assert!((rouge_l_recall(NEEDLE, answer) - 12.0 / 21.0).abs() < 1e-12);
        assert_eq!(rouge_l_recall(NEEDLE, NEEDLE), 1.0);
        // Order matters: "day sunny" keeps only one of the two words in sequence.
        assert!((rouge_l_recall("sunny day", "day sunny") - 0.5).abs() < 1e-12);
        assert_eq!(rouge_l_recall("", "anything"), 0.0);
        assert_eq!(rouge_l_recall(NEEDLE, ""), 0.0);
    }
}
