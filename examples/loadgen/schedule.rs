//! Mode `rate`: each worker's schedule, and the alarm it sleeps on until a request is due.

use std::time::{Duration, Instant};

/// How long before a request is due its worker stops sleeping and yields until it is time.
const SPIN: Duration = Duration::from_micros(30);

/// A worker's alarm for fixed-rate sends: a `timerfd` armed for an absolute time on the
/// monotonic clock (the clock `Instant` reads), which the kernel fires to within microseconds.
/// tokio's own timer counts whole milliseconds: a deadline is rounded up to the next one, and
/// the runtime parks for whole milliseconds from wherever it is inside the current one, so it
/// fires up to about 2 ms late. Sleeping on it to 1 ms before a request was due sent most
/// requests late (by 0.4 ms at the median at 1,000/s), and that lateness was measured as the
/// server's latency. Yielding through the last milliseconds instead kept the load generator
/// busy, which with `--threads` on cores shared with the servers took their CPU.
struct Alarm {
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    /// One `Instant` and the monotonic clock's reading at the same moment.
    base: (Instant, Duration),
}

impl Alarm {
    fn new() -> std::io::Result<Alarm> {
        use std::os::fd::FromRawFd;
        // SAFETY: a plain system call; its result is checked before use.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write to.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let base = (
            Instant::now(),
            Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32),
        );
        let interest = tokio::io::Interest::READABLE;
        // SAFETY: the `OwnedFd` is a valid, open descriptor, and it is moved into the
        // `AsyncFd`, so it stays open and the same for as long as that is registered.
        let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }?;
        Ok(Alarm { fd, base })
    }

    /// Sleep until `at`. An error is the alarm's, not the server's: the caller ends the run.
    async fn sleep_until(&self, at: Instant) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let when = self.base.1 + at.saturating_duration_since(self.base.0);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: when.as_secs() as libc::time_t,
                tv_nsec: libc::c_long::from(when.subsec_nanos() as i32),
            },
        };
        let fd = self.fd.get_ref().as_raw_fd();
        // SAFETY: `spec` is a valid itimerspec; the old value is not asked for.
        let armed = unsafe {
            libc::timerfd_settime(fd, libc::TFD_TIMER_ABSTIME, &spec, std::ptr::null_mut())
        };
        if armed != 0 {
            return Err(std::io::Error::last_os_error());
        }
        loop {
            let mut ready = self.fd.readable().await?;
            let mut expirations = [0u8; 8];
            // SAFETY: reads at most 8 bytes into an 8-byte buffer.
            let read = unsafe { libc::read(fd, expirations.as_mut_ptr().cast(), 8) };
            if read == 8 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::WouldBlock {
                return Err(e);
            }
            ready.clear_ready();
        }
    }
}

/// Mode `rate`: when a worker's requests are due, and its alarm to wait for them.
pub(crate) struct Schedule {
    rate: u64,
    alarm: Alarm,
    busy_poll: bool,
}

impl Schedule {
    /// `rate` requests per second; with `busy_poll`, wait by yielding, never asleep.
    pub(crate) fn new(rate: u64, busy_poll: bool) -> std::io::Result<Schedule> {
        Ok(Schedule {
            rate,
            alarm: Alarm::new()?,
            busy_poll,
        })
    }

    /// When request `seq` is due: its slot in a schedule that began at `start`.
    pub(crate) fn due(&self, start: Instant, seq: u64) -> Instant {
        start + Duration::from_nanos(seq.saturating_mul(1_000_000_000) / self.rate)
    }

    /// Wait until `at`, to within a few µs: asleep on the alarm until [`SPIN`] before it (all
    /// the way with `--busy-poll`), then yielding.
    pub(crate) async fn until(&self, at: Instant) {
        let wake = at.checked_sub(SPIN).filter(|w| *w > Instant::now());
        if let (Some(wake), false) = (wake, self.busy_poll) {
            // Yielding through the wait instead would take the CPU of servers sharing the cores.
            if let Err(e) = self.alarm.sleep_until(wake).await {
                eprintln!("loadgen: timerfd: {e}");
                std::process::exit(1);
            }
        }
        while Instant::now() < at {
            tokio::task::yield_now().await;
        }
    }
}
