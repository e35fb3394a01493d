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

    /// The name and help among `opts`.
    fn common(opts: &Self::Opts) -> &Opts;

    /// The series of one label set.
    fn series(opts: &Self::Opts, labels: HashMap<String, String>) -> prometheus::Result<Self>;

    /// The family's description: its name, help and label names.
    fn describe(opts: &Self::Opts, names: Vec<String>) -> prometheus::Result<Desc> {
        let common = Self::common(opts);
        Desc::new(common.fq_name(), common.help.clone(), names, HashMap::new())
    }
}

impl Series for IntCounter {
    type Opts = Opts;

    fn common(opts: &Opts) -> &Opts {
        opts
    }

    fn series(opts: &Opts, labels: HashMap<String, String>) -> prometheus::Result<Self> {
        IntCounter::with_opts(opts.clone().const_labels(labels))
    }
}

impl Series for IntGauge {
    type Opts = Opts;

    fn common(opts: &Opts) -> &Opts {
        opts
    }

    fn series(opts: &Opts, labels: HashMap<String, String>) -> prometheus::Result<Self> {
        IntGauge::with_opts(opts.clone().const_labels(labels))
    }
}

impl Series for Histogram {
    type Opts = HistogramOpts;

    fn common(opts: &HistogramOpts) -> &Opts {
        &opts.common_opts
    }

    fn series(opts: &HistogramOpts, labels: HashMap<String, String>) -> prometheus::Result<Self> {
        Histogram::with_opts(opts.clone().const_labels(labels))
    }
}

/// Values kept by a set of `N` label values: found by the values' hash, compared in full (what
/// prometheus's vectors do not do), made the first time a set is met. A family's series and
/// an upstream's GenAI series ([`super::GenAiSeries`]) are kept so.
pub struct ByLabels<V, const N: usize> {
    kept: parking_lot::RwLock<crate::FastMap<u64, Vec<Labelled<V, N>>>>,
}

/// A value with its label values.
type Labelled<V, const N: usize> = ([Box<str>; N], V);

impl<V, const N: usize> Default for ByLabels<V, N> {
    fn default() -> Self {
        ByLabels { kept: parking_lot::RwLock::default() }
    }
}

/// The hash of a label set: fixed per process.
static LABELS_HASH: std::sync::LazyLock<foldhash::fast::RandomState> = std::sync::LazyLock::new(Default::default);

impl<V, const N: usize> ByLabels<V, N> {
    /// `read` of the value of `labels`, made with `make` and kept the first time they are met
    /// (`None`: `make` made none, and nothing is kept).
    pub fn with<R>(
        &self,
        labels: [&str; N],
        make: impl FnOnce() -> Option<V>,
        read: impl FnOnce(&V) -> R,
    ) -> Option<R> {
        let hash = LABELS_HASH.hash_one(labels);
        let same = |kept: &&Labelled<V, N>| kept.0.iter().zip(&labels).all(|(have, want)| **have == **want);
        if let Some((_, value)) = self.kept.read().get(&hash).and_then(|all| all.iter().find(same)) {
            return Some(read(value));
        }
        let mut kept = self.kept.write();
        if let Some((_, value)) = kept.get(&hash).and_then(|all| all.iter().find(same)) {
            return Some(read(value));
        }
        let value = make()?;
        let read = read(&value);
        kept.entry(hash).or_default().push((labels.map(Box::from), value));
        Some(read)
    }

    /// Every value kept, in no order.
    fn each(&self, mut visit: impl FnMut(&V)) {
        self.kept.read().values().flatten().for_each(|(_, value)| visit(value));
    }
}

/// One metric's series by label set (`N` labels, named at its making).
pub struct Family<M: Series, const N: usize> {
    opts: M::Opts,
    names: [&'static str; N],
    desc: Desc,
    series: ByLabels<M, N>,
}

impl<M: Series, const N: usize> Family<M, N> {
    pub fn new(opts: M::Opts, names: [&'static str; N]) -> prometheus::Result<Family<M, N>> {
        let desc = M::describe(&opts, names.iter().map(|name| name.to_string()).collect())?;
        Ok(Family { opts, names, desc, series: ByLabels::default() })
    }

    /// `record` on the series of `labels`, made the first time they are met (so that a series
    /// shows once it has been recorded on, as a vector's did).
    pub fn with(&self, labels: [&str; N], record: impl FnOnce(&M)) {
        // The names were checked when the family was made; a value is any text.
        let make = || {
            let pairs = self.names.iter().zip(&labels).map(|(name, value)| (name.to_string(), value.to_string()));
            M::series(&self.opts, pairs.collect()).ok()
        };
        self.series.with(labels, make, record);
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
        let mut family: Option<MetricFamily> = None;
        self.series.each(|series| match &mut family {
            Some(family) => family.mut_metric().push(series.metric()),
            None => family = series.collect().into_iter().next(),
        });
        family.into_iter().collect()
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
