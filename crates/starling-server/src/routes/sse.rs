//! Server-sent events for streamed answers: one `data: {json}` chunk per generated token, an
//! optional usage chunk, then `data: [DONE]`.
//!
//! Dropping the response body (the client went away) drops the event receiver, which the
//! engine thread notices before its next step and aborts the request.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use starling_engine::RequestOutput;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api_error::ApiError;
use crate::engine_thread::RequestEvent;
use crate::protocol::Usage;

/// Turns engine outputs into the JSON chunks of one endpoint.
pub trait ChunkFormatter: Send + 'static {
    /// Chunks sent before any token (chat: the assistant role).
    fn start(&mut self) -> Vec<String>;
    /// Chunks for one output.
    fn output(&mut self, output: &RequestOutput) -> Vec<String>;
    /// The usage chunk, when the client asked for one.
    fn usage(&mut self, usage: Usage) -> Option<String>;
}

struct StreamState<F> {
    events: UnboundedReceiver<RequestEvent>,
    formatter: F,
    pending: VecDeque<String>,
    done: bool,
}

impl<F: ChunkFormatter> StreamState<F> {
    /// Waits for the next engine event and queues its chunks.
    async fn refill(&mut self) {
        match self.events.recv().await {
            Some(RequestEvent::Output(output)) => {
                self.pending.extend(self.formatter.output(&output));
                if output.finished.is_some() {
                    let usage = Usage::new(output.num_prompt_tokens, output.num_output_tokens);
                    self.pending.extend(self.formatter.usage(usage));
                    self.finish();
                }
            }
            Some(RequestEvent::Failed(error)) => self.fail(error),
            Some(RequestEvent::Accepted) | Some(RequestEvent::Rejected(_)) => {}
            None => self.fail(ApiError::unavailable(
                "the engine stopped before the request finished",
            )),
        }
    }

    fn fail(&mut self, error: ApiError) {
        match serde_json::to_string(&error.body()) {
            Ok(json) => self.pending.push_back(json),
            Err(e) => tracing::error!("serialising a stream error: {e}"),
        }
        self.finish();
    }

    fn finish(&mut self) {
        self.pending.push_back("[DONE]".to_owned());
        self.done = true;
    }
}

/// A streaming response over `events`, formatted by `formatter`.
pub fn sse_response<F: ChunkFormatter>(
    events: UnboundedReceiver<RequestEvent>,
    mut formatter: F,
) -> Response {
    let pending: VecDeque<String> = formatter.start().into();
    let state = StreamState {
        events,
        formatter,
        pending,
        done: false,
    };
    let chunks = stream::unfold(state, |mut state| async move {
        loop {
            if let Some(data) = state.pending.pop_front() {
                let event: Result<Event, Infallible> = Ok(Event::default().data(data));
                return Some((event, state));
            }
            if state.done {
                return None;
            }
            state.refill().await;
        }
    });
    Sse::new(chunks).into_response()
}
