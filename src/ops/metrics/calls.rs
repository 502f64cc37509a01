//! Every call's two series, `carapace_requests_total` (by front, tool, outcome and reason) and
//! `carapace_request_duration_seconds` (by front and tool), kept per thread.
//!
//! A worker thread counts its calls into series only it writes: a count, a sum and a bucket
//! each updated by a load and a store, with no locked instruction and no lock. A scrape adds
//! up every thread's series ([`CallSeriesCollector`]). A thread finds its series by label set
//! in a table of its own; the first call of a label set on a thread makes the series and lists
//! it where scrapes find it (a lock taken once per thread and label set).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use thread_local::ThreadLocal;

/// The upper bounds of the latency buckets, in seconds: 100 µs doubling up to about 6.5 s
/// (then `+Inf`).
const BOUNDS: [f64; 17] = {
    let mut bounds = [0.0; 17];
    let mut i = 0;
    while i < bounds.len() {
        bounds[i] = 0.0001 * (1u64 << i) as f64;
        i += 1;
    }
    bounds
};

/// A call's label set: front, tool, outcome and reason.
type CallLabels = (&'static str, String, &'static str, &'static str);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    front: &'static str,
    tool: String,
    outcome: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    front: &'static str,
    tool: String,
}

/// One thread's calls of one label set: their latencies by bucket, which also count them.
/// One thread at a time writes it (the thread whose table holds it); scrapes read it.
#[derive(Debug, Default)]
struct Series {
    /// The latencies' sum, in seconds, as `f64` bits.
    sum: AtomicU64,
    /// Calls per bucket (not cumulative); the last one is above every bound.
    buckets: [AtomicU64; BOUNDS.len() + 1],
}

/// Add one to a counter only this thread writes.
fn add_one(counter: &AtomicU64) {
    counter.store(counter.load(Relaxed).wrapping_add(1), Relaxed);
}

impl Series {
    /// Count one call that took `secs`. Only the thread whose table holds the series calls
    /// this.
    fn observe(&self, secs: f64) {
        let sum = f64::from_bits(self.sum.load(Relaxed)) + secs;
        self.sum.store(sum.to_bits(), Relaxed);
        let bucket = BOUNDS
            .iter()
            .position(|bound| secs <= *bound)
            .unwrap_or(BOUNDS.len());
        add_one(&self.buckets[bucket]);
    }
}

/// A thread's own table of its series, and the label set it looks them up with (reused, so
/// a call allocates nothing).
#[derive(Default)]
struct ThreadSeries {
    key: CallLabels,
    series: HashMap<CallLabels, Arc<Series>, foldhash::fast::RandomState>,
}

/// The call series of one process, by thread.
#[derive(Default)]
pub(super) struct CallSeries {
    threads: ThreadLocal<RefCell<ThreadSeries>>,
    /// Every series any thread made, with its label set: what a scrape adds up.
    all: Mutex<Vec<(CallLabels, Arc<Series>)>>,
}

impl std::fmt::Debug for CallSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallSeries")
    }
}

impl CallSeries {
    /// Count one call of `tool` on `front` that ended with `outcome` (and `reason`) after
    /// `took`, in this thread's series.
    pub(super) fn observe(
        &self,
        (front, tool, outcome, reason): (&'static str, &str, &'static str, &'static str),
        took: Duration,
    ) {
        let thread = self.threads.get_or(RefCell::default);
        // Nothing below calls back into `observe`, so the borrow is never taken twice.
        let mut thread = thread.borrow_mut();
        let ThreadSeries { key, series } = &mut *thread;
        key.1.clear();
        key.1.push_str(tool);
        (key.0, key.2, key.3) = (front, outcome, reason);
        let found = match series.get(&*key) {
            Some(found) => found,
            None => {
                let made = Arc::new(Series::default());
                self.all
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((key.clone(), made.clone()));
                series.entry(key.clone()).or_insert(made)
            }
        };
        found.observe(took.as_secs_f64());
    }

    /// Every thread's series added up: the count per label set, and the latencies per front
    /// and tool (sum, count, calls per bucket). A series' count is the sum of its buckets as
    /// read, so a scrape during a call still shows `_count` equal to the `+Inf` bucket and to
    /// the requests counted.
    fn totals(&self) -> Totals {
        let mut counts = BTreeMap::new();
        let mut latencies: BTreeMap<_, Latency> = BTreeMap::new();
        for ((front, tool, outcome, reason), s) in
            self.all.lock().unwrap_or_else(|e| e.into_inner()).iter()
        {
            let buckets = s.buckets.each_ref().map(|b| b.load(Relaxed));
            let count: u64 = buckets.iter().sum();
            *counts
                .entry((*front, tool.clone(), *outcome, *reason))
                .or_default() += count;
            let latency = latencies.entry((*front, tool.clone())).or_default();
            latency.sum += f64::from_bits(s.sum.load(Relaxed));
            latency.count += count;
            for (total, b) in latency.buckets.iter_mut().zip(buckets) {
                *total += b;
            }
        }
        (counts, latencies)
    }
}

/// Counts by call label set, latencies by front and tool.
type Totals = (
    BTreeMap<CallLabels, u64>,
    BTreeMap<(&'static str, String), Latency>,
);

/// The latencies of one front and tool, every thread's added up.
#[derive(Default)]
struct Latency {
    sum: f64,
    count: u64,
    buckets: [u64; BOUNDS.len() + 1],
}

/// Writes [`CallSeries`] into a scrape, under the names and labels the two families had.
#[derive(Debug)]
pub(super) struct CallSeriesCollector(pub(super) Arc<CallSeries>);

impl Collector for CallSeriesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (counts, latencies) = self.0.totals();
        let mut requests = encoder.encode_descriptor(
            "requests",
            // With the period `Registry::register` adds to the help of the metrics it holds.
            "Requests by front, tool and outcome (ok, app_error, or the error code the caller got) with carapace's finer reason for a refusal.",
            None,
            MetricType::Counter,
        )?;
        for ((front, tool, outcome, reason), count) in counts {
            let labels = RequestLabels {
                front,
                tool,
                outcome,
                reason,
            };
            requests
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(&count, None)?;
        }
        let mut durations = encoder.encode_descriptor(
            "request_duration_seconds",
            "Time from request to response, by front and tool.",
            None,
            MetricType::Histogram,
        )?;
        for ((front, tool), latency) in latencies {
            let buckets: Vec<(f64, u64)> = BOUNDS
                .iter()
                .copied()
                .chain([f64::MAX])
                .zip(latency.buckets)
                .collect();
            durations
                .encode_family(&LatencyLabels { front, tool })?
                .encode_histogram::<NoLabelSet>(latency.sum, latency.count, &buckets, None)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    fn scrape(calls: &Arc<CallSeries>) -> String {
        let mut registry = Registry::with_prefix("carapace");
        registry.register_collector(Box::new(CallSeriesCollector(calls.clone())));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn the_buckets_are_the_documented_ones() {
        assert_eq!(BOUNDS[0], 0.0001);
        assert_eq!(
            BOUNDS.to_vec(),
            prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 17)
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_scrape_adds_up_the_calls_of_every_thread() {
        let calls = Arc::new(CallSeries::default());
        let ok = ("tools-v1", "memory.query", "ok", "");
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..100 {
                        calls.observe(ok, Duration::from_micros(150));
                    }
                    calls.observe(
                        ("tools-v1", "memory.query", "INVALID_ARGS", "input_schema"),
                        Duration::from_secs(10),
                    );
                });
            }
        });
        calls.observe(
            ("skill-v1", "", "UNAUTHORIZED", "signature"),
            Duration::ZERO,
        );
        let text = scrape(&calls);
        for line in [
            r#"carapace_requests_total{front="tools-v1",tool="memory.query",outcome="ok",reason=""} 300"#,
            r#"carapace_requests_total{front="tools-v1",tool="memory.query",outcome="INVALID_ARGS",reason="input_schema"} 3"#,
            r#"carapace_requests_total{front="skill-v1",tool="",outcome="UNAUTHORIZED",reason="signature"} 1"#,
            // 150 µs is above the first bound, within the second; 10 s above every bound.
            r#"carapace_request_duration_seconds_bucket{le="0.0001",front="tools-v1",tool="memory.query"} 0"#,
            r#"carapace_request_duration_seconds_bucket{le="0.0002",front="tools-v1",tool="memory.query"} 300"#,
            r#"carapace_request_duration_seconds_bucket{le="6.5536",front="tools-v1",tool="memory.query"} 300"#,
            r#"carapace_request_duration_seconds_bucket{le="+Inf",front="tools-v1",tool="memory.query"} 303"#,
            r#"carapace_request_duration_seconds_count{front="tools-v1",tool="memory.query"} 303"#,
            r#"carapace_request_duration_seconds_bucket{le="0.0001",front="skill-v1",tool=""} 1"#,
            "# TYPE carapace_requests counter",
            "# TYPE carapace_request_duration_seconds histogram",
            "# HELP carapace_request_duration_seconds Time from request to response, by front and tool.",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line} in\n{text}");
        }
        let sum = text
            .lines()
            .find_map(|l| {
                l.strip_prefix(
                    r#"carapace_request_duration_seconds_sum{front="tools-v1",tool="memory.query"} "#,
                )
            })
            .expect("the sum's line")
            .parse::<f64>()
            .unwrap();
        assert!((sum - 30.045).abs() < 1e-9, "sum {sum}");
    }

    #[test]
    fn before_any_call_a_scrape_describes_both_series() {
        let text = scrape(&Arc::new(CallSeries::default()));
        for line in [
            "# HELP carapace_requests Requests by front, tool and outcome (ok, app_error, or the error code the caller got) with carapace's finer reason for a refusal.",
            "# TYPE carapace_requests counter",
            "# TYPE carapace_request_duration_seconds histogram",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line} in\n{text}");
        }
        assert!(!text.contains("carapace_requests_total"), "{text}");
        assert!(
            !text.contains("carapace_request_duration_seconds_count"),
            "{text}"
        );
    }
}
