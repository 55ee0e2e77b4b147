//! [`Watchdog`]: the timeout on collectives. A rank waiting in a collective for a peer that
//! died, hangs or took another path would wait forever; the watchdog thread ends the whole
//! run instead, with a message naming this rank and the collective.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the watchdog calls when a collective has run past the timeout: prints nothing
/// itself, ends the run (MPI: `MPI_Abort`).
pub(crate) type OnTimeout = Box<dyn Fn(&str) + Send>;

#[derive(Default)]
struct Shared {
    /// The collective in progress: its name and start.
    current: Mutex<Option<(String, Instant)>>,
    wake: Condvar,
    done: AtomicBool,
}

/// A thread that watches the collective in progress and calls its `on_timeout` when one has
/// not returned within the timeout.
///
/// PyTorch equivalent: the `timeout` of `torch.distributed.init_process_group` with NCCL's
/// watchdog (`TORCH_NCCL_ASYNC_ERROR_HANDLING`) tearing the job down.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Clears the watched collective when dropped (when the collective returned).
pub(crate) struct Watch<'a>(Option<&'a Shared>);

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if let Some(shared) = self.0 {
            *shared.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

impl Watchdog {
    /// Starts the thread; `timeout == 0` watches nothing (no thread).
    pub(crate) fn start(prefix: String, timeout: Duration, on_timeout: OnTimeout) -> Self {
        let shared = Arc::new(Shared::default());
        if timeout.is_zero() {
            return Self {
                shared,
                thread: None,
            };
        }
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("mha-dist-watchdog".into())
            .spawn(move || {
                // Polls a few times per timeout (at most every 100 ms): the deadline is met
                // within a tenth of the timeout, and an idle run costs nothing measurable.
                let tick = (timeout / 10).clamp(Duration::from_millis(1), Duration::from_millis(100));
                let mut guard = s.current.lock().unwrap_or_else(|p| p.into_inner());
                while !s.done.load(Ordering::Relaxed) {
                    if let Some((what, started)) = guard.as_ref() {
                        if started.elapsed() >= timeout {
                            let msg = format!(
                                "{prefix}{what} did not complete within {} s (the collective timeout): another rank has died, hangs or stopped at another step; ending the run",
                                timeout.as_secs_f64()
                            );
                            on_timeout(&msg);
                            return;
                        }
                    }
                    guard = s
                        .wake
                        .wait_timeout(guard, tick)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            })
            .ok();
        Self { shared, thread }
    }

    /// Watches the collective `what` until the returned guard drops.
    pub(crate) fn watch(&self, what: &str) -> Watch<'_> {
        if self.thread.is_none() {
            return Watch(None);
        }
        *self
            .shared
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some((what.to_string(), Instant::now()));
        Watch(Some(&self.shared))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.done.store(true, Ordering::Relaxed);
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn fires_only_on_a_collective_past_the_timeout() {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let dog = Watchdog::start(
            "rank 0 of 2: ".into(),
            Duration::from_millis(200),
            Box::new(move |m| {
                let _ = tx.lock().unwrap().send(m.to_string());
            }),
        );
        {
            let _w = dog.watch("quick");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Idle past the timeout: nothing is watched.
        std::thread::sleep(Duration::from_millis(300));
        assert!(rx.try_recv().is_err());
        let _w = dog.watch("step 3: all-reduce of gradient bucket 1 of 1");
        let msg = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(msg.starts_with("rank 0 of 2: step 3: all-reduce"), "{msg}");
        assert!(msg.contains("0.2 s"), "{msg}");
    }
}
