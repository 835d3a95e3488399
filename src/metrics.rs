//! Prometheus metrics: webhook deliveries by receiver and outcome, ticks by
//! target and result, tick duration, and — read from the database at scrape
//! time — jobs queued, the last successful run and drift per target, and
//! the destinations paused by a rate limit.
//!
//! Counting never fails and never blocks; this module only counts and
//! renders, it decides nothing.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeliveryLabels {
    pub receiver: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TickLabels {
    pub target: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabels {
    pub target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DestinationLabels {
    /// `forge \`github\` (api.github.com)`: never a credential.
    pub destination: String,
}

fn duration_histogram() -> Histogram {
    // 50 ms … ~7 h
    Histogram::new([
        0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0,
    ])
}

/// The process's metrics.
pub struct Metrics {
    registry: Registry,
    deliveries: Family<DeliveryLabels, Counter>,
    ticks: Family<TickLabels, Counter>,
    tick_seconds: Family<TargetLabels, Histogram, fn() -> Histogram>,
    queued: Family<TargetLabels, Gauge>,
    last_success: Family<TargetLabels, Gauge>,
    drift: Family<TargetLabels, Gauge>,
    paused_until: Family<DestinationLabels, Gauge>,
    window_open: Family<TargetLabels, Gauge>,
    window_change: Family<TargetLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("driftless");
        let deliveries = Family::<DeliveryLabels, Counter>::default();
        let ticks = Family::<TickLabels, Counter>::default();
        let tick_seconds =
            Family::<TargetLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                duration_histogram,
            );
        let queued = Family::<TargetLabels, Gauge>::default();
        let last_success = Family::<TargetLabels, Gauge>::default();
        let drift = Family::<TargetLabels, Gauge>::default();
        let paused_until = Family::<DestinationLabels, Gauge>::default();
        let window_open = Family::<TargetLabels, Gauge>::default();
        let window_change = Family::<TargetLabels, Gauge>::default();
        registry.register(
            "webhook_deliveries",
            "Webhook deliveries by receiver and outcome",
            deliveries.clone(),
        );
        registry.register("ticks", "Finished runs by target and result", ticks.clone());
        registry.register(
            "tick_duration_seconds",
            "Run duration by target",
            tick_seconds.clone(),
        );
        registry.register(
            "jobs_queued",
            "Jobs waiting in the queue, by target",
            queued.clone(),
        );
        registry.register(
            "last_success_timestamp_seconds",
            "When the target last converged successfully (Unix time)",
            last_success.clone(),
        );
        registry.register(
            "drift",
            "1 while a `detect` target's last plan found the real world differs from git",
            drift.clone(),
        );
        registry.register(
            "destination_paused_until_timestamp_seconds",
            "A forge or notifier destination that answered with a rate limit: nothing is sent to it before this time (Unix time)",
            paused_until.clone(),
        );
        registry.register(
            "window_open",
            "1 while a target with change windows (`windows`) may start work, 0 while its jobs wait",
            window_open.clone(),
        );
        registry.register(
            "window_next_change_timestamp_seconds",
            "When a target's change window next opens or closes (Unix time)",
            window_change.clone(),
        );
        Metrics {
            window_open,
            window_change,
            registry,
            deliveries,
            ticks,
            tick_seconds,
            queued,
            last_success,
            drift,
            paused_until,
        }
    }

    pub fn delivery(&self, receiver: &str, outcome: &str) {
        self.deliveries
            .get_or_create(&DeliveryLabels {
                receiver: receiver.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn tick(&self, target: &str, result: &str, seconds: f64) {
        self.ticks
            .get_or_create(&TickLabels {
                target: target.to_string(),
                result: result.to_string(),
            })
            .inc();
        self.tick_seconds
            .get_or_create(&TargetLabels {
                target: target.to_string(),
            })
            .observe(seconds);
    }

    /// Set the gauges read from the database, then render everything in
    /// the Prometheus text format.
    pub fn render(
        &self,
        queued: &[(String, i64)],
        last_success_ms: &[(String, i64)],
        drifting: &[(String, bool)],
        paused: &[(String, i64)],
        windows: &[(String, bool, Option<i64>)],
    ) -> String {
        self.window_open.clear();
        self.window_change.clear();
        for (t, open, change) in windows {
            let labels = TargetLabels { target: t.clone() };
            self.window_open
                .get_or_create(&labels)
                .set(i64::from(*open));
            if let Some(at) = change {
                self.window_change.get_or_create(&labels).set(*at);
            }
        }
        self.paused_until.clear();
        for (d, ms) in paused {
            self.paused_until
                .get_or_create(&DestinationLabels {
                    destination: d.clone(),
                })
                .set(ms / 1000);
        }
        for (t, d) in drifting {
            self.drift
                .get_or_create(&TargetLabels { target: t.clone() })
                .set(i64::from(*d));
        }
        self.queued.clear();
        for (t, n) in queued {
            self.queued
                .get_or_create(&TargetLabels { target: t.clone() })
                .set(*n);
        }
        for (t, ms) in last_success_ms {
            self.last_success
                .get_or_create(&TargetLabels { target: t.clone() })
                .set(ms / 1000);
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.push_str("# encoding failed\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_gauges() {
        let m = Metrics::new();
        m.delivery("github", "queued");
        m.delivery("github", "queued");
        m.tick("web", "changed", 0.3);
        let text = m.render(
            &[("web".into(), 1)],
            &[("web".into(), 1_700_000_000_000)],
            &[("web".into(), true), ("db".into(), false)],
            &[("forge `gh` (api.github.com)".into(), 1_700_000_600_000)],
            &[("web".into(), false, Some(1_700_003_600))],
        );
        assert!(text.contains("driftless_drift{target=\"web\"} 1"), "{text}");
        assert!(
            text.contains("driftless_window_open{target=\"web\"} 0"),
            "{text}"
        );
        assert!(
            text.contains(
                "driftless_window_next_change_timestamp_seconds{target=\"web\"} 1700003600"
            ),
            "{text}"
        );
        assert!(
            text.contains("driftless_destination_paused_until_timestamp_seconds{destination=\"forge `gh` (api.github.com)\"} 1700000600"),
            "{text}"
        );
        assert!(text.contains("driftless_drift{target=\"db\"} 0"), "{text}");
        assert!(
            text.contains(
                "driftless_webhook_deliveries_total{receiver=\"github\",outcome=\"queued\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains("driftless_ticks_total{target=\"web\",result=\"changed\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("driftless_tick_duration_seconds_count{target=\"web\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("driftless_jobs_queued{target=\"web\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("driftless_last_success_timestamp_seconds{target=\"web\"} 1700000000"),
            "{text}"
        );
    }
}
