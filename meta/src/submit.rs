//! The threads that submit every part's work but the first's when the part graphs hold
//! all-reduce nodes: a part's graph then waits inside for the other parts, so each part is
//! submitted from its own thread. The threads stay from run to run: handing work to a waiting
//! thread costs far less than starting one.
//!
//! A thread asleep takes longer to wake than a part takes to submit its work, so a run first
//! wakes the threads ([`Submitters::wake`]) and a thread polls for its next job for [`SPIN`]
//! after each one before it sleeps again.
//!
//! Plain threads rather than a rayon pool: a rayon worker that waits inside rayon (a CPU part's
//! parallel loops) may take another part's submission and run it on top of its own, which then
//! waits forever for the part beneath it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use tessera_core::error::{Error, Result};

/// A job as a worker thread receives it.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// How long a thread polls for its next job after one before it sleeps (a run's work reaches
/// its threads within tens of µs of [`Submitters::wake`]).
const SPIN: Duration = Duration::from_micros(300);

/// One waiting thread per part after the first; a thread ends when this is dropped.
pub(crate) struct Submitters {
    workers: Vec<mpsc::Sender<Job>>,
}

impl Submitters {
    /// Starts `n` threads for the meta device `device` (named in errors and thread names).
    pub(crate) fn new(n: usize, device: &str) -> Result<Submitters> {
        let workers = (0..n)
            .map(|i| {
                let (tx, rx) = mpsc::channel::<Job>();
                thread::Builder::new()
                    .name(format!("tessera-submit-{}", i + 1))
                    .spawn(move || work(&rx))
                    .map_err(|e| Error::Device {
                        device: device.to_string(),
                        reason: format!("cannot start a submitting thread: {e}"),
                    })?;
                Ok(tx)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Submitters { workers })
    }

    /// Wakes every thread (an empty job), so that the work a run hands them next finds them
    /// polling rather than asleep.
    pub(crate) fn wake(&self) {
        for w in &self.workers {
            // A thread that is gone shows itself in `run`.
            let _ = w.send(Box::new(|| {}));
        }
    }

    /// Runs `each(i, item)` for item i of `items` on thread i, concurrently with `own` on the
    /// calling thread, and returns `own`'s result and each item's (an error where one panicked
    /// or there is no thread i) once every one has finished.
    pub(crate) fn run<T: Send, R: Send, O>(
        &self,
        items: Vec<T>,
        each: &(dyn Fn(usize, T) -> Result<R> + Sync),
        own: impl FnOnce() -> O,
    ) -> (O, Vec<Result<R>>) {
        let (done, rx) = mpsc::channel::<(usize, Result<R>)>();
        let mut out: Vec<Option<Result<R>>> = (0..items.len()).map(|_| None).collect();
        let mut wait = Wait { rx, pending: 0 };
        for (i, item) in items.into_iter().enumerate() {
            let done = done.clone();
            let job: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
                let r = catch_unwind(AssertUnwindSafe(|| each(i, item)))
                    .unwrap_or_else(|_| Err(Error::Invalid("a part's submission panicked".into())));
                // The receiver waits for this message (see Wait), so it is there to take it.
                let _ = done.send((i, r));
            });
            // SAFETY: the job borrows from this call (`each`, and what `items` borrow). This
            // call does not return, nor unwind past `wait`, before every job handed to a thread
            // has sent its message (`wait` receives one per job, also while unwinding), and a
            // job sends it last, after its last use of what it borrows; a job that could not be
            // handed over is dropped here, unrun.
            let job: Job =
                unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + '_>, Job>(job) };
            match self.workers.get(i).map(|w| w.send(job)) {
                Some(Ok(())) => wait.pending += 1,
                _ => {
                    out[i] = Some(Err(Error::Invalid(format!(
                        "no submitting thread for part {}",
                        i + 1
                    ))))
                }
            }
        }
        drop(done);
        let own = own();
        while wait.pending > 0 {
            match wait.rx.recv() {
                Ok((i, r)) => {
                    out[i] = Some(r);
                    wait.pending -= 1;
                }
                Err(_) => break,
            }
        }
        let results = out
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(Error::Invalid("a part's submission did not run".into())))
            })
            .collect();
        (own, results)
    }
}

/// A submitting thread's loop: each job, then [`SPIN`] of polling for the next before it
/// sleeps until one comes; it ends when its [`Submitters`] is dropped.
fn work(rx: &mpsc::Receiver<Job>) {
    'sleep: loop {
        let Ok(mut job) = rx.recv() else {
            return;
        };
        loop {
            job();
            let since = Instant::now();
            job = loop {
                match rx.try_recv() {
                    Ok(next) => break next,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                    Err(mpsc::TryRecvError::Empty) if since.elapsed() > SPIN => continue 'sleep,
                    Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
                }
            };
        }
    }
}

/// The messages still to come from jobs handed to threads; dropping it waits for them, so that
/// no job outlives the call that lent it what it borrows, even when that call unwinds.
struct Wait<R> {
    rx: mpsc::Receiver<(usize, Result<R>)>,
    pending: usize,
}

impl<R> Drop for Wait<R> {
    fn drop(&mut self) {
        while self.pending > 0 && self.rx.recv().is_ok() {
            self.pending -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    #[test]
    fn every_item_runs_concurrently_with_the_caller_and_borrows_from_it() {
        let s = Submitters::new(3, "meta:test").unwrap();
        // All four meet at a barrier: a run that were not concurrent would never return.
        let barrier = Arc::new(Barrier::new(4));
        for round in 0..3 {
            let mut slots = vec![0usize; 3];
            let b = barrier.clone();
            let each = move |i: usize, slot: &mut usize| {
                b.wait();
                *slot = 10 * round + i;
                Ok(i * 2)
            };
            if round > 0 {
                // A woken thread takes its work while it polls (and a second job while it
                // polls after the first).
                s.wake();
            }
            let (own, results) = s.run(slots.iter_mut().collect(), &each, || {
                barrier.wait();
                7
            });
            assert_eq!(own, 7);
            let results: Vec<usize> = results.into_iter().map(|r| r.unwrap()).collect();
            assert_eq!(results, vec![0, 2, 4]);
            assert_eq!(slots, vec![10 * round, 10 * round + 1, 10 * round + 2]);
        }
    }

    #[test]
    fn a_panicking_item_is_an_error_and_the_threads_live_on() {
        let s = Submitters::new(2, "meta:test").unwrap();
        let each = |i: usize, ()| -> Result<usize> {
            if i == 0 {
                panic!("part 1 fails");
            }
            Ok(i)
        };
        for _ in 0..2 {
            let ((), results) = s.run(vec![(), ()], &each, || ());
            assert!(matches!(results[0], Err(Error::Invalid(_))));
            assert_eq!(results[1].as_ref().unwrap(), &1);
        }
        // More items than threads: the extra one is an error, not a hang.
        let ((), results) = s.run(vec![(), (), ()], &|i, ()| Ok(i), || ());
        assert_eq!(results[1].as_ref().unwrap(), &1);
        assert!(results[2].is_err());
    }
}
