//! The response future shared by layers that either refuse at once or delegate.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::Rejection;

pin_project! {
    /// Resolves to a [`Rejection`] immediately, or to the inner service's future.
    #[project = ReadyOrProj]
    pub enum ReadyOr<F> {
        /// Refused before calling the inner service.
        Rejected { rejection: Option<Rejection> },
        /// The inner service's future.
        Inner { #[pin] future: F },
    }
}

impl<F> ReadyOr<F> {
    /// Refuse with `rejection`.
    pub fn reject(rejection: Rejection) -> Self {
        ReadyOr::Rejected {
            rejection: Some(rejection),
        }
    }

    /// Wait for the inner service.
    pub fn inner(future: F) -> Self {
        ReadyOr::Inner { future }
    }
}

impl<F, T> Future for ReadyOr<F>
where
    F: Future<Output = Result<T, Rejection>>,
{
    type Output = Result<T, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ReadyOrProj::Rejected { rejection } => Poll::Ready(Err(rejection
                .take()
                .expect("ReadyOr polled after completion"))),
            ReadyOrProj::Inner { future } => future.poll(cx),
        }
    }
}
