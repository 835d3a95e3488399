//! Rollouts in waves (`rollout = { waves = [1, "25%", "100%"], pause = "5m" }`
//! on a `[[target_sets]]` entry or a `[[groups]]` entry): the settings, and
//! which member belongs to which wave. Pure; it knows nothing of runs, the
//! store or time. Driving a rollout is `tick::rollout`'s.

use std::collections::BTreeMap;
use std::time::Duration;

/// How many members a wave reaches, counted from the first wave
/// (cumulative).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// `3`: three members in all by the end of this wave.
    Count(usize),
    /// `"25%"`: a quarter of the members (rounded up) by the end of it.
    Percent(u8),
}

impl Size {
    /// Parse `"25%"` (1 to 100).
    pub fn percent(s: &str) -> Option<Size> {
        let n: u8 = s.trim().strip_suffix('%')?.trim().parse().ok()?;
        (1..=100).contains(&n).then_some(Size::Percent(n))
    }

    /// The cumulative count among `total` members.
    fn of(self, total: usize) -> usize {
        match self {
            Size::Count(n) => n.min(total),
            Size::Percent(p) => (total * usize::from(p)).div_ceil(100),
        }
    }
}

/// A rollout's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    pub waves: Vec<Size>,
    /// How long after a wave is applied and healthy the next one starts.
    pub pause: Duration,
    /// Members placed in a wave by name (1-based), whatever their order.
    pub wave_of: BTreeMap<String, usize>,
}

impl Rollout {
    /// Which wave (1-based) each of `members` is in: those named in
    /// `wave_of` in theirs; the others in name order, filling each wave up
    /// to its cumulative count (explicit members counted), the rest in the
    /// last wave. A wave may end up empty; it is skipped.
    pub fn assign(&self, members: &[String]) -> Vec<(String, usize)> {
        let total = members.len();
        let last = self.waves.len().max(1);
        let mut sorted: Vec<&String> = members.iter().collect();
        sorted.sort();
        let mut out: Vec<(String, usize)> = Vec::new();
        let mut rest = sorted
            .iter()
            .filter(|m| !self.wave_of.contains_key(m.as_str()))
            .peekable();
        let mut placed = 0;
        for (i, size) in self.waves.iter().enumerate() {
            let wave = i + 1;
            let explicit: Vec<&String> = sorted
                .iter()
                .copied()
                .filter(|m| self.wave_of.get(m.as_str()) == Some(&wave))
                .collect();
            placed += explicit.len();
            out.extend(explicit.into_iter().map(|m| (m.clone(), wave)));
            while placed < size.of(total) {
                let Some(m) = rest.next() else { break };
                out.push(((*m).clone(), wave));
                placed += 1;
            }
        }
        out.extend(rest.map(|m| ((*m).clone(), last)));
        // A `wave_of` beyond the waves (refused by `check`) goes last.
        for m in &sorted {
            if let Some(w) = self.wave_of.get(m.as_str())
                && *w > self.waves.len()
            {
                out.push(((*m).clone(), last));
            }
        }
        out.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
        out
    }
}

/// The waves that have members, in order.
pub fn nonempty_waves(members: &[(String, usize)]) -> Vec<usize> {
    let mut w: Vec<usize> = members.iter().map(|(_, w)| *w).collect();
    w.sort();
    w.dedup();
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("h{i:02}")).collect()
    }

    fn r(waves: Vec<Size>, wave_of: &[(&str, usize)]) -> Rollout {
        Rollout {
            waves,
            pause: Duration::ZERO,
            wave_of: wave_of.iter().map(|(n, w)| (n.to_string(), *w)).collect(),
        }
    }

    fn sizes(a: &[(String, usize)], waves: usize) -> Vec<usize> {
        (1..=waves)
            .map(|w| a.iter().filter(|(_, x)| *x == w).count())
            .collect()
    }

    #[test]
    fn counts_are_cumulative_and_percentages_round_up() {
        let plan = r(
            vec![Size::Count(1), Size::Percent(25), Size::Percent(100)],
            &[],
        );
        let a = plan.assign(&names(12));
        assert_eq!(sizes(&a, 3), [1, 2, 9]);
        assert_eq!(a[0], ("h00".to_string(), 1));
        // Five members: 25 % is 2 (rounded up).
        assert_eq!(sizes(&plan.assign(&names(5)), 3), [1, 1, 3]);
        // Two members: the second wave is empty (skipped).
        let two = plan.assign(&names(2));
        assert_eq!(sizes(&two, 3), [1, 0, 1]);
        assert_eq!(nonempty_waves(&two), [1, 3]);
    }

    #[test]
    fn wave_of_places_a_member_and_counts_toward_its_wave() {
        let plan = r(
            vec![Size::Count(1), Size::Count(3), Size::Percent(100)],
            &[("h03", 1)],
        );
        let a = plan.assign(&names(5));
        let wave = |n: &str| a.iter().find(|(m, _)| m == n).map(|(_, w)| *w);
        assert_eq!(wave("h03"), Some(1));
        assert_eq!(wave("h00"), Some(2), "{a:?}");
        assert_eq!(sizes(&a, 3), [1, 2, 2]);
    }

    #[test]
    fn members_past_the_last_count_go_in_the_last_wave() {
        let plan = r(vec![Size::Count(1), Size::Count(2)], &[]);
        assert_eq!(sizes(&plan.assign(&names(4)), 2), [1, 3]);
        assert_eq!(Size::percent("25%"), Some(Size::Percent(25)));
        assert_eq!(Size::percent("0%"), None);
        assert_eq!(Size::percent("101%"), None);
    }
}
