//! A session's generation as an async [`Stream`] (feature `async`): the session moves to a
//! thread of its own that generates, and the pieces arrive through a channel, so an async
//! runtime never blocks on a step. Dropping the stream cancels the generation.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use futures_channel::mpsc::{unbounded, UnboundedReceiver};
use futures_core::Stream;
use tessera_core::{Error, Result};

use crate::generate::{Cancel, GenOptions};
use crate::session::{Piece, Session};

/// The pieces of a generation running on its own thread.
pub struct PieceStream {
    rx: UnboundedReceiver<Result<Piece>>,
    cancel: Cancel,
    thread: Option<JoinHandle<Session>>,
}

impl Session {
    /// Completes `text` (as [`Session::complete`]) on a thread of its own; the pieces come as a
    /// [`Stream`]. [`PieceStream::into_session`] gives the session back.
    pub fn into_stream(mut self, text: String, mut opts: GenOptions) -> Result<PieceStream> {
        let cancel = opts.cancel.get_or_insert_with(Cancel::new).clone();
        let (tx, rx) = unbounded();
        let thread = std::thread::Builder::new()
            .name("tessera-session".into())
            .spawn(move || {
                match self.complete(&text, opts) {
                    Ok(pieces) => {
                        for p in pieces {
                            if tx.unbounded_send(p).is_err() {
                                break;
                            }
                        }
                    }
                    Err(e) => {
                        let _ = tx.unbounded_send(Err(e));
                    }
                }
                self
            })
            .map_err(|e| Error::io("starting a session's thread", e))?;
        Ok(PieceStream {
            rx,
            cancel,
            thread: Some(thread),
        })
    }
}

impl PieceStream {
    /// Ends the generation (cancelled if still running) and returns the session, holding what
    /// was evaluated. Blocks until the current step is done.
    pub fn into_session(mut self) -> Result<Session> {
        self.cancel.cancel();
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .ok_or_else(|| Error::Invalid("the session's thread panicked".into()))
    }
}

impl Stream for PieceStream {
    type Item = Result<Piece>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.rx).poll_next(cx)
    }
}

impl Drop for PieceStream {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
