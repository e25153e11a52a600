//! The answer of a Responses route with its ids rewritten (see
//! [`super::response_id`]) as it passes: SSE is rewritten event by event (a
//! partial event waits for its end, which a client could not use anyway), a
//! JSON body as a whole once it has ended.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;

use super::response_id::{IdScope, rewrite_answer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where the ids are issued from.
#[derive(Debug, Clone)]
pub struct Issuer {
    pub scope: IdScope,
    pub endpoint: String,
    pub instance: String,
}

impl Issuer {
    fn rewrite(&self, bytes: Vec<u8>) -> Bytes {
        match rewrite_answer(&bytes, &self.scope, &self.endpoint, &self.instance) {
            Some(out) => out.into(),
            None => bytes.into(),
        }
    }
}

pin_project_lite::pin_project! {
    pub struct RewriteIds<S> {
        #[pin]
        inner: S,
        issuer: Issuer,
        sse: bool,
        pending: Vec<u8>,
        done: bool,
    }
}

impl<S> RewriteIds<S> {
    pub fn new(inner: S, issuer: Issuer, sse: bool) -> Self {
        Self {
            inner,
            issuer,
            sse,
            pending: Vec::new(),
            done: false,
        }
    }
}

/// The end of the last complete SSE event in `buf`.
fn events_end(buf: &[u8]) -> Option<usize> {
    let lf = memchr::memmem::rfind(buf, b"\n\n").map(|i| i + 2);
    let crlf = memchr::memmem::rfind(buf, b"\r\n\r\n").map(|i| i + 4);
    lf.max(crlf)
}

impl<S> Stream for RewriteIds<S>
where
    S: Stream<Item = Result<Bytes, BoxError>>,
{
    type Item = Result<Bytes, BoxError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        loop {
            if *this.done {
                return Poll::Ready(None);
            }
            match this.inner.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    this.pending.extend_from_slice(&chunk);
                    if !*this.sse {
                        continue;
                    }
                    if let Some(end) = events_end(this.pending) {
                        let rest = this.pending.split_off(end);
                        let ready = std::mem::replace(this.pending, rest);
                        return Poll::Ready(Some(Ok(this.issuer.rewrite(ready))));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    *this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    *this.done = true;
                    if this.pending.is_empty() {
                        return Poll::Ready(None);
                    }
                    let rest = std::mem::take(this.pending);
                    return Poll::Ready(Some(Ok(this.issuer.rewrite(rest))));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn issuer() -> Issuer {
        Issuer {
            scope: IdScope::new(None, "t"),
            endpoint: "e".into(),
            instance: "i".into(),
        }
    }

    async fn run(chunks: Vec<&'static str>, sse: bool) -> Vec<String> {
        let inner = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, BoxError>(Bytes::from_static(c.as_bytes()))),
        );
        RewriteIds::new(inner, issuer(), sse)
            .map(|c| String::from_utf8(c.unwrap().to_vec()).unwrap())
            .collect()
            .await
    }

    #[tokio::test]
    async fn sse_events_are_rewritten_whole_whatever_the_cuts() {
        let id = IdScope::new(None, "t").encode("e", "i", "resp_1");
        let out = run(
            vec![
                "event: response.created\ndata: {\"response\":{\"id\":\"re",
                "sp_1\"}}\n\nevent: x\ndata: {\"delta\":\"a\"}\n\n",
                "data: {\"response\":{\"id\":\"resp_1\"}}\n\n",
            ],
            true,
        )
        .await;
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(
            out[0].contains(&id) && out[0].ends_with("\"a\"}\n\n"),
            "{out:?}"
        );
        assert!(out[1].contains(&id));
    }

    #[tokio::test]
    async fn json_is_rewritten_once_it_ends() {
        let out = run(vec!["{\"id\":", "\"resp_1\"}"], false).await;
        assert_eq!(out.len(), 1);
        assert!(out[0].contains("resp_kvg1_"), "{out:?}");
    }
}
