//! A labelled metric whose series are told apart by their whole label values.
//!
//! prometheus 0.14's vectors (`IntCounterVec`, `HistogramVec`, …) find a series by an FNV hash
//! of its label values written one after the other with nothing between them, and take the
//! series kept under that hash without comparing labels. So tenant `ab`'s route `c` and tenant
//! `a`'s route `bc` were one series, shown under whichever came first: tenants name their own
//! routes, targets and models, so one tenant could fold its counts into another's (found
//! 2026-12-06, issue 33's metrics work). A [`Family`] keeps each series under its label values
//! themselves and is collected as the vector was: the same name, help, labels, type and text.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use prometheus::core::{Collector, Desc, Metric};
use prometheus::proto::MetricFamily;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Opts};

/// A kind of series a [`Family`] holds: made with its label values as constant labels.
pub trait Series: Collector + Metric + Sized + 'static {
    type Opts: Send + Sync;

    /// The family's description: its name, help and label names.
    fn describe(opts: &Self::Opts, names: Vec<String>) -> prometheus::Result<Desc>;

    /// The series of one label set.
    fn series(opts: &Self::Opts, labels: HashMap<String, String>) -> prometheus::Result<Self>;
}

impl Series for IntCounter {
    type Opts = Opts;

    fn describe(opts: &Opts, names: Vec<String>) -> prometheus::Result<Desc> {
        Desc::new(opts.fq_name(), opts.help.clone(), names, HashMap::new())
    }

    fn series(opts: &Opts, labels: HashMap<String, String>) -> prometheus::Result<Self> {
        IntCounter::with_opts(opts.clone().const_labels(labels))
    }
}

impl Series for IntGauge {
    type Opts = Opts;

    fn describe(opts: &Opts, names: Vec<String>) -> prometheus::Result<Desc> {
        Desc::new(opts.fq_name(), opts.help.clone(), names, HashMap::new())
    }

    fn series(opts: &Opts, labels: HashMap<String, String>) -> prometheus::Result<Self> {
        IntGauge::with_opts(opts.clone().const_labels(labels))
    }
}

impl Series for Histogram {
    type Opts = HistogramOpts;

    fn describe(opts: &HistogramOpts, names: Vec<String>) -> prometheus::Result<Desc> {
        Desc::new(opts.common_opts.fq_name(), opts.common_opts.help.clone(), names, HashMap::new())
    }

    fn series(opts: &HistogramOpts, labels: HashMap<String, String>) -> prometheus::Result<Self> {
        Histogram::with_opts(opts.clone().const_labels(labels))
    }
}

/// The series kept under one hash of label values: each with its values, compared in full.
type Kept<M, const N: usize> = Vec<([Box<str>; N], M)>;

/// One metric's series by label set (`N` labels, named at its making).
pub struct Family<M: Series, const N: usize> {
    opts: M::Opts,
    names: [&'static str; N],
    desc: Desc,
    series: parking_lot::RwLock<crate::FastMap<u64, Kept<M, N>>>,
}

/// The hash of a label set: fixed per process.
static LABELS_HASH: std::sync::LazyLock<foldhash::fast::RandomState> = std::sync::LazyLock::new(Default::default);

impl<M: Series, const N: usize> Family<M, N> {
    pub fn new(opts: M::Opts, names: [&'static str; N]) -> prometheus::Result<Family<M, N>> {
        let desc = M::describe(&opts, names.iter().map(|name| name.to_string()).collect())?;
        Ok(Family { opts, names, desc, series: parking_lot::RwLock::default() })
    }

    /// `record` on the series of `labels`, made the first time they are met (so that a series
    /// shows once it has been recorded on, as a vector's did).
    pub fn with(&self, labels: [&str; N], record: impl FnOnce(&M)) {
        let hash = LABELS_HASH.hash_one(labels);
        let same = |kept: &&([Box<str>; N], M)| kept.0.iter().zip(&labels).all(|(have, want)| **have == **want);
        if let Some((_, series)) = self.series.read().get(&hash).and_then(|all| all.iter().find(same)) {
            return record(series);
        }
        let mut kept = self.series.write();
        if let Some((_, series)) = kept.get(&hash).and_then(|all| all.iter().find(same)) {
            return record(series);
        }
        // The names were checked when the family was made; a value is any text.
        let pairs = self.names.iter().zip(&labels).map(|(name, value)| (name.to_string(), value.to_string()));
        let Ok(series) = M::series(&self.opts, pairs.collect()) else { return };
        record(&series);
        kept.entry(hash).or_default().push((labels.map(Box::from), series));
    }
}

impl<M: Series + Clone, const N: usize> Family<M, N> {
    /// The series of `labels`, to be kept by its caller ([`super::GenAiSeries`]).
    pub fn series(&self, labels: [&str; N]) -> Option<M> {
        let mut found = None;
        self.with(labels, |series| found = Some(series.clone()));
        found
    }
}

impl<M: Series, const N: usize> Collector for Family<M, N> {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    /// Every series' sample, as one family (the registry sorts them by label values): its
    /// name, help and type as the first series tells them, then each series' sample.
    fn collect(&self) -> Vec<MetricFamily> {
        let kept = self.series.read();
        let mut all = kept.values().flatten().map(|(_, series)| series);
        let Some(mut family) = all.next().and_then(|first| first.collect().into_iter().next()) else {
            return Vec::new();
        };
        family.mut_metric().extend(all.map(Metric::metric));
        vec![family]
    }
}

/// A family registered with a registry and kept by [`super::Metrics`].
pub struct Registered<M: Series, const N: usize>(Arc<Family<M, N>>);

impl<M: Series, const N: usize> Registered<M, N> {
    pub fn new(family: Family<M, N>, registry: &prometheus::Registry) -> prometheus::Result<Registered<M, N>> {
        let family = Arc::new(family);
        registry.register(Box::new(Collected(family.clone())))?;
        Ok(Registered(family))
    }
}

impl<M: Series, const N: usize> std::ops::Deref for Registered<M, N> {
    type Target = Family<M, N>;

    fn deref(&self) -> &Family<M, N> {
        &self.0
    }
}

/// The registry's handle on a family.
struct Collected<M: Series, const N: usize>(Arc<Family<M, N>>);

impl<M: Series, const N: usize> Collector for Collected<M, N> {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.0.collect()
    }
}
