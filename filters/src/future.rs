//! The response futures shared by layers that either refuse at once or delegate, possibly
//! after an asynchronous check.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tower::Service;

use crate::{BoxFuture, Rejection};

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

pin_project! {
    /// Like [`ReadyOr`], with a third way: an asynchronous check (a shared store's answer)
    /// that must pass before the inner service is called with the request it holds.
    #[project = GatedProj]
    pub enum Gated<S, R, F> {
        /// Decided without waiting: refused, or already delegated.
        Decided { #[pin] future: ReadyOr<F> },
        /// Waiting for the check; its service is ready and is called once the check passes.
        /// Boxed: the request waits here only on this slower path (a shared store's answer),
        /// and held inline it would make every request's future, and every layer's around it,
        /// as large as a request.
        Checking { pending: Option<Box<Pending<S, R>>> },
        /// The check passed: the inner service's future.
        Calling { #[pin] future: F },
    }
}

impl<S, R, F> Gated<S, R, F> {
    /// Refuse with `rejection`.
    pub fn reject(rejection: Rejection) -> Self {
        Gated::Decided {
            future: ReadyOr::reject(rejection),
        }
    }

    /// Wait for the inner service.
    pub fn inner(future: F) -> Self {
        Gated::Decided {
            future: ReadyOr::inner(future),
        }
    }

    /// Call the ready `service` with `request` once `check` passes.
    pub fn checking(check: BoxFuture<Result<(), Rejection>>, service: S, request: R) -> Self {
        Gated::Checking {
            pending: Some(Box::new(Pending {
                check,
                service,
                request,
            })),
        }
    }
}

/// What a [`Gated`] future keeps while its check runs.
pub struct Pending<S, R> {
    check: BoxFuture<Result<(), Rejection>>,
    service: S,
    request: R,
}

impl<S, R, T> Future for Gated<S, R, S::Future>
where
    S: Service<R, Response = T, Error = Rejection>,
{
    type Output = Result<T, Rejection>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project() {
                GatedProj::Decided { future } => return future.poll(cx),
                GatedProj::Calling { future } => return future.poll(cx),
                GatedProj::Checking { pending } => {
                    let p = pending.as_mut().expect("Gated polled after completion");
                    if let Err(r) = ready!(p.check.as_mut().poll(cx)) {
                        pending.take();
                        return Poll::Ready(Err(r));
                    }
                    let Pending {
                        mut service,
                        request,
                        ..
                    } = *pending.take().expect("checked above");
                    let future = service.call(request);
                    self.set(Gated::Calling { future });
                }
            }
        }
    }
}
