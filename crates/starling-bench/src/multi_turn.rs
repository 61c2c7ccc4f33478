//! Multi-turn chat from ShareGPT conversations (`--dataset sharegpt_multiturn`): turn `k` of a
//! conversation is one request whose prompt is the whole transcript so far — every earlier human
//! turn with the dataset's reply to it — plus the new human turn, so with prefix caching it
//! reuses the blocks of turn `k − 1`. Requests go out turn-major (every conversation's first
//! turn, then every second turn, …), so a turn is sent after the one before it has been
//! admitted when the conversations outnumber the concurrency.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::client::StreamClient;
use crate::dataset::{BenchPrompt, BenchRequest};
use crate::error::BenchError;

/// Shortest prompt and reply kept (vLLM's ShareGPT filter).
const MIN_LEN_TOKENS: usize = 4;

/// One turn of a conversation as a request's text.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnText {
    /// The transcript up to and including this turn's human message, ending where the reply
    /// starts.
    pub prompt: String,
    /// The dataset's reply (its length is the request's `max_tokens`).
    pub reply: String,
    /// Which conversation (after shuffling).
    pub conversation: usize,
    /// Which turn of it, from 0.
    pub turn: usize,
}

/// The turns of `conversations` (shuffled with `seed`, at most `max_conversations`, each at
/// most `max_turns` long; conversations with all `max_turns` turns where there are enough of
/// them) in turn-major order.
pub fn turn_texts(
    mut conversations: Vec<Vec<(String, String)>>,
    seed: u64,
    max_conversations: usize,
    max_turns: usize,
) -> Vec<TurnText> {
    if conversations
        .iter()
        .filter(|c| c.len() >= max_turns)
        .count()
        >= max_conversations
    {
        conversations.retain(|c| c.len() >= max_turns);
    }
    conversations.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    conversations.truncate(max_conversations);
    let mut per_conversation: Vec<Vec<TurnText>> = conversations
        .into_iter()
        .enumerate()
        .map(|(conversation, exchanges)| {
            let mut transcript = String::new();
            exchanges
                .into_iter()
                .take(max_turns)
                .enumerate()
                .map(|(turn, (human, reply))| {
                    transcript.push_str(&format!("User: {human}\nAssistant:"));
                    let prompt = transcript.clone();
                    transcript.push_str(&format!(" {reply}\n"));
                    TurnText {
                        prompt,
                        reply,
                        conversation,
                        turn,
                    }
                })
                .collect()
        })
        .collect();
    let longest = per_conversation.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = Vec::new();
    for turn in 0..longest {
        for turns in &mut per_conversation {
            if let Some(t) = turns.get(turn) {
                out.push(t.clone());
            }
        }
    }
    out
}

/// Up to `num_prompts` requests from the turns of `num_prompts / max_turns` (rounded up)
/// conversations ([`turn_texts`]), lengths measured with the server's tokenizer; conversations
/// shorter than `max_turns` give fewer. A turn shorter than vLLM's 4-token minimum is not sent
/// (it stays in the later turns' transcripts); a conversation ends at its first turn that does
/// not fit `max_model_len_tokens` (its later turns only grow).
pub async fn multi_turn_requests(
    conversations: Vec<Vec<(String, String)>>,
    num_prompts: usize,
    seed: u64,
    max_turns: usize,
    client: &StreamClient,
    max_model_len_tokens: usize,
) -> Result<Vec<BenchRequest>, BenchError> {
    let max_turns = max_turns.max(1);
    let turns = turn_texts(
        conversations,
        seed,
        num_prompts.div_ceil(max_turns),
        max_turns,
    );
    let mut ended: Vec<usize> = Vec::new();
    let mut requests = Vec::with_capacity(num_prompts);
    for t in turns {
        if requests.len() == num_prompts {
            break;
        }
        if ended.contains(&t.conversation) {
            continue;
        }
        let prompt_len = client.count_tokens(&t.prompt).await?;
        let output_len = client.count_tokens(&t.reply).await?;
        if prompt_len + output_len > max_model_len_tokens {
            ended.push(t.conversation);
            continue;
        }
        if prompt_len < MIN_LEN_TOKENS || output_len < MIN_LEN_TOKENS {
            continue;
        }
        requests.push(BenchRequest {
            prompt: BenchPrompt::Text(t.prompt),
            prompt_len_tokens: prompt_len,
            output_len_tokens: output_len,
        });
    }
    if requests.is_empty() {
        return Err(BenchError::Invalid(
            "no conversation turn fits the server's context".into(),
        ));
    }
    Ok(requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation(n: usize, tag: &str) -> Vec<(String, String)> {
        (0..n)
            .map(|i| (format!("{tag} asks {i}"), format!("{tag} answers {i}")))
            .collect()
    }

    #[test]
    fn turns_go_out_turn_major_and_each_prompt_extends_the_previous_one() {
        let convs = vec![
            conversation(3, "a"),
            conversation(1, "b"),
            conversation(2, "c"),
        ];
        let turns = turn_texts(convs, 7, 10, 10);
        assert_eq!(turns.len(), 6);
        // Every first turn before any second turn, every second before any third.
        let order: Vec<usize> = turns.iter().map(|t| t.turn).collect();
        assert!(order.windows(2).all(|w| w[0] <= w[1]), "{order:?}");
        // Turn k's prompt starts with turn k − 1's prompt and its reply.
        for t in turns.iter().filter(|t| t.turn > 0) {
            let prev = turns
                .iter()
                .find(|p| p.conversation == t.conversation && p.turn == t.turn - 1)
                .unwrap();
            assert!(t
                .prompt
                .starts_with(&format!("{} {}\n", prev.prompt, prev.reply)));
            assert!(t.prompt.ends_with("Assistant:"));
        }
    }

    #[test]
    fn full_length_conversations_are_preferred_when_there_are_enough() {
        let convs = vec![
            conversation(1, "a"),
            conversation(4, "b"),
            conversation(4, "c"),
        ];
        let turns = turn_texts(convs, 3, 2, 4);
        assert_eq!(turns.len(), 8);
        assert!(turns.iter().all(|t| !t.prompt.contains("a asks")));
    }

    #[test]
    fn limits_cap_conversations_and_turns() {
        let convs = vec![
            conversation(5, "a"),
            conversation(5, "b"),
            conversation(5, "c"),
        ];
        let turns = turn_texts(convs, 1, 2, 3);
        assert_eq!(turns.len(), 6);
        assert!(turns.iter().all(|t| t.conversation < 2 && t.turn < 3));
        // The same seed gives the same requests.
        let again = turn_texts(
            vec![
                conversation(5, "a"),
                conversation(5, "b"),
                conversation(5, "c"),
            ],
            1,
            2,
            3,
        );
        assert_eq!(turns, again);
    }
}
