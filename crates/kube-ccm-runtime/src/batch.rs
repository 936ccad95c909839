//! Batching cloud look-ups: many concurrent single requests become few batch calls.
//!
//! A batch takes whatever is queued (up to `max_batch`) when a slot is free; at most `max_in_flight`
//! batches run at once. Under a burst of new nodes the queue grows while batches are in flight, so the
//! batches grow with the load and the cloud sees one call per batch.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

type Job<Req, Resp> = (Req, oneshot::Sender<Resp>);

/// A handle to a batching task; cloning shares it.
pub(crate) struct Batcher<Req, Resp> {
    sender: mpsc::UnboundedSender<Job<Req, Resp>>,
}

impl<Req, Resp> Clone for Batcher<Req, Resp> {
    fn clone(&self) -> Self {
        Batcher {
            sender: self.sender.clone(),
        }
    }
}

impl<Req: Send + 'static, Resp: Send + 'static> Batcher<Req, Resp> {
    /// Starts the task; it ends when every handle is dropped. `call` answers one request per entry, in order.
    /// Before a batch is gathered, `gate` is awaited with its first request (the cloud budget's turn), so
    /// what arrives meanwhile joins it.
    pub(crate) fn spawn<G, GFut, F, Fut>(
        max_batch: usize,
        max_in_flight: usize,
        gate: G,
        call: F,
    ) -> Batcher<Req, Resp>
    where
        G: Fn(&Req) -> GFut + Send + Sync + 'static,
        GFut: Future<Output = ()> + Send,
        F: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Resp>> + Send + 'static,
    {
        let (sender, mut receiver) = mpsc::unbounded_channel::<Job<Req, Resp>>();
        let call = Arc::new(call);
        let slots = Arc::new(Semaphore::new(max_in_flight.max(1)));
        tokio::spawn(async move {
            while let Some(first) = receiver.recv().await {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                // Until the call may go (the cloud budget's turn), more requests join the batch.
                gate(&first.0).await;
                let mut batch = vec![first];
                while batch.len() < max_batch {
                    match receiver.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                let call = call.clone();
                tokio::spawn(async move {
                    let (requests, replies): (Vec<Req>, Vec<oneshot::Sender<Resp>>) =
                        batch.into_iter().unzip();
                    let answers = call(requests).await;
                    for (reply, answer) in replies.into_iter().zip(answers) {
                        // The asker may have given up; nothing to do then.
                        let _ = reply.send(answer);
                    }
                    drop(permit);
                });
            }
        });
        Batcher { sender }
    }

    /// Asks one thing; `None` when the batch call did not answer it.
    pub(crate) async fn call(&self, request: Req) -> Option<Resp> {
        let (reply, answer) = oneshot::channel();
        self.sender.send((request, reply)).ok()?;
        answer.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_becomes_few_batches() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let recorded = sizes.clone();
        let batcher = Batcher::spawn(
            100,
            2,
            |_: &u32| async {},
            move |requests: Vec<u32>| {
                recorded.lock().push(requests.len());
                async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    requests.into_iter().map(|r| r * 2).collect::<Vec<_>>()
                }
            },
        );
        let answers = futures::future::join_all((0..250).map(|i| {
            let batcher = batcher.clone();
            async move { batcher.call(i).await }
        }))
        .await;
        assert!(answers.iter().enumerate().all(|(i, a)| *a == Some(i as u32 * 2)));
        let sizes = sizes.lock().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 250);
        assert!(
            sizes.len() <= 4,
            "250 requests in {} batches: {sizes:?}",
            sizes.len()
        );
        assert!(sizes.iter().all(|&s| s <= 100));
    }
}
