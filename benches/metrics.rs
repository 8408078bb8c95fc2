//! What metrics cost a command (ns): the per-command counter, the latency histogram, the
//! command-class lookup the session does for them, and a scrape.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use criterion::{Criterion, criterion_group, criterion_main};
use redis_policy_proxy::commands;
use redis_policy_proxy::metrics::{CommandOutcome, Metrics, class_of};
use redis_policy_proxy::policy::Policy;

fn metrics(c: &mut Criterion) {
    let metrics = Metrics::new(Arc::new(ArcSwap::from_pointee(Policy::default())));
    let mut group = c.benchmark_group("metrics");
    group.bench_function("class lookup (GET)", |b| {
        b.iter(|| black_box(class_of(commands::lookup(black_box(b"GET"), Some(b"k")))))
    });
    group.bench_function("command counter", |b| {
        b.iter(|| metrics.command(black_box(0), CommandOutcome::Forwarded))
    });
    group.bench_function("latency histogram, batch of 16", |b| {
        b.iter(|| {
            metrics
                .request_duration
                .observe_n(black_box(Duration::from_micros(180)), 16)
        })
    });
    group.bench_function("scrape /metrics", |b| {
        b.iter(|| black_box(metrics.render()))
    });
    group.finish();
}

criterion_group!(benches, metrics);
criterion_main!(benches);
