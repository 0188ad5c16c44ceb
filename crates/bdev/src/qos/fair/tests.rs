use super::*;
use crate::qos::sim::{flood, Channel};

const NS: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
const ALL: u64 = u64::MAX / 4;

fn fill(limit: u64, members: &[(u64, u64)]) -> Vec<u64> {
    let mut weight = [0; MAX_MEMBERS];
    let mut want = [0; MAX_MEMBERS];
    for (i, &(w, d)) in members.iter().enumerate() {
        (weight[i], want[i]) = (w, d);
    }
    water_fill(limit, &weight, &want)[..members.len()].to_vec()
}

#[test]
fn water_filling_is_weighted_max_min_and_adds_up_to_the_limit() {
    assert_eq!(fill(10_000, &[(3, ALL), (1, ALL)]), [7_500, 2_500]);
    assert_eq!(fill(10_000, &[(3, ALL), (1, 0)]), [10_000, 0]);
    assert_eq!(fill(10_000, &[(5, ALL), (3, ALL), (2, ALL)]), [5_000, 3_000, 2_000]);
    // A light member gets what it wants; the heavy one the rest.
    assert_eq!(fill(10_000, &[(3, ALL), (1, 1_000)]), [9_000, 1_000]);
    // The light member's want exceeds its share: shares.
    assert_eq!(fill(10_000, &[(3, ALL), (1, 4_000)]), [7_500, 2_500]);
    // Satisfied in two rounds: C (want 1,000 < 10,000/10) first, then B (3,000 < 9,000 * 3/7).
    assert_eq!(fill(10_000, &[(4, ALL), (3, 3_000), (3, 1_000)]), [6_000, 3_000, 1_000]);
    // Everyone satisfied: the rest by weight among all.
    assert_eq!(fill(10_000, &[(1, 1_000), (1, 2_000)]), [4_500, 5_500]);
    // Rounding remainders to the first; the sum is exact.
    assert_eq!(fill(10, &[(1, ALL), (1, ALL), (1, ALL)]), [4, 3, 3]);
    assert_eq!(fill(1_000_003, &[(7, ALL), (0, ALL), (5, 10)]).iter().sum::<u64>(), 1_000_003);
}

/// A member channel that always has a request waiting (closed loop), admitting requests of
/// cost `n`.
fn flooding<'a>(g: &'a FairGroup, id: MemberId, n: u64) -> Channel<'a> {
    flooding_until(g, id, n, u64::MAX)
}

/// As [`flooding`], but no new request from tick `stop` on (the one waiting still goes).
fn flooding_until<'a>(g: &'a FairGroup, id: MemberId, n: u64, stop: u64) -> Channel<'a> {
    let mut ch = FairChannel::new(id);
    let mut retry = false;
    Channel::new(move |now| {
        if now >= stop && !retry {
            return Err(Wait(u64::MAX));
        }
        let r = ch.admit(g, now, n, retry);
        retry = r.is_err();
        r
    })
}

/// A member channel that gets one request every `gap` ticks from `from` on (open loop).
fn paced<'a>(g: &'a FairGroup, id: MemberId, gap: u64, from: u64) -> Channel<'a> {
    let mut ch = FairChannel::new(id);
    let (mut next, mut retry) = (from, false);
    Channel::new(move |now| {
        if now < next {
            return Err(Wait(next));
        }
        let r = ch.admit(g, now, 1, retry);
        retry = r.is_err();
        if r.is_ok() {
            next += gap;
        }
        r
    })
}

fn group(limit: u64) -> FairGroup {
    let g = FairGroup::new(NS, FairGroup::default_slice(NS));
    g.set_limit(limit, 0).unwrap();
    g
}

fn within(got: u64, want: u64, per_mille: u64) -> bool {
    got * 1000 >= want * (1000 - per_mille) && got * 1000 <= want * (1000 + per_mille)
}

#[test]
fn two_flooding_members_get_shares_by_weight_and_an_idle_ones_share_goes_to_the_other() {
    let g = group(10_000);
    let (a, b) = (g.join(3, 0).unwrap(), g.join(1, 0).unwrap());
    let mut chs = [flooding(&g, a, 1), flooding_until(&g, b, 1, 11030 * MS)];
    // Two slices to learn the demand, then exact shares.
    flood(&mut chs, 0, 30 * MS);
    assert_eq!((g.member_rate(a), g.member_rate(b)), (7_500, 2_500));
    let n = flood(&mut chs, 30 * MS, 1030 * MS);
    assert!(within(n[0], 7_500, 5) && within(n[1], 2_500, 5), "{n:?}");
    assert_eq!((g.member_rate(a), g.member_rate(b)), (7_500, 2_500));
    let n = flood(&mut chs, 1030 * MS, 11030 * MS);
    assert!(within(n[0], 75_000, 2) && within(n[1], 25_000, 2), "{n:?}");
    // B goes idle: its waiting request goes, and from the slice after A has the whole limit.
    flood(&mut chs, 11030 * MS, 11060 * MS);
    assert_eq!((g.member_rate(a), g.member_rate(b)), (10_000, 1));
    let n = flood(&mut chs, 11060 * MS, 12060 * MS);
    assert!(within(n[0], 10_000, 5) && n[1] == 0, "{n:?}");
}

#[test]
fn a_member_alone_from_the_start_gets_the_whole_limit() {
    let g = group(10_000);
    let (a, _b) = (g.join(3, 0).unwrap(), g.join(1, 0).unwrap());
    let mut chs = [flooding(&g, a, 1)];
    let n = flood(&mut chs, 0, NS);
    assert_eq!(g.member_rate(a), 10_000);
    // The first slice is spent learning (one request at one unit per second).
    assert!(within(n[0], 9_900, 5), "{n:?}");
}

#[test]
fn uneven_weights_and_a_light_member_get_what_they_want() {
    let g = group(10_000);
    let ids: Vec<_> = [5, 3, 2].iter().map(|&w| g.join(w, 0).unwrap()).collect();
    let mut chs: Vec<_> = ids.iter().map(|&id| flooding(&g, id, 1)).collect();
    flood(&mut chs, 0, 30 * MS);
    let n = flood(&mut chs, 30 * MS, 1030 * MS);
    assert!(within(n[0], 5_000, 5) && within(n[1], 3_000, 5) && within(n[2], 2_000, 5), "{n:?}");
    // A light member (1,000 a second, weight 1 of 4): it gets all it asks, A gets the rest
    // but the eighth of B's demand held for B's bursts.
    let g = group(10_000);
    let (a, b) = (g.join(3, 0).unwrap(), g.join(1, 0).unwrap());
    let mut chs = [flooding(&g, a, 1), paced(&g, b, MS, 0)];
    flood(&mut chs, 0, 50 * MS);
    let n = flood(&mut chs, 50 * MS, 1050 * MS);
    assert!(within(n[1], 1_000, 2), "{n:?}");
    assert!(within(n[0], 8_875, 10), "{n:?}");
    assert!(n[0] + n[1] <= 10_000 + 20, "{n:?}");
}

#[test]
fn members_join_and_leave() {
    let g = group(10_000);
    let (a, b) = (g.join(3, 0).unwrap(), g.join(1, 0).unwrap());
    let mut chs = vec![flooding(&g, a, 1), flooding(&g, b, 1)];
    flood(&mut chs, 0, 30 * MS);
    let c = g.join(4, 30 * MS).unwrap();
    chs.push(flooding(&g, c, 1));
    flood(&mut chs, 30 * MS, 60 * MS);
    assert_eq!((g.member_rate(a), g.member_rate(b), g.member_rate(c)), (3_750, 1_250, 5_000));
    let n = flood(&mut chs, 60 * MS, 1060 * MS);
    assert!(within(n[0], 3_750, 5) && within(n[1], 1_250, 5) && within(n[2], 5_000, 5), "{n:?}");
    chs.pop();
    g.leave(c).unwrap();
    flood(&mut chs, 1060 * MS, 1090 * MS);
    assert_eq!((g.member_rate(a), g.member_rate(b)), (7_500, 2_500));
    assert_eq!(g.leave(c), Err(QosError::NoMember(c.0)));
    assert_eq!(g.join(0, 0), Err(QosError::BadWeight(0)));
    // The weight counts from the next slice.
    g.set_weight(b, 3).unwrap();
    flood(&mut chs, 1090 * MS, 1120 * MS);
    assert_eq!((g.member_rate(a), g.member_rate(b)), (5_000, 5_000));
}

#[test]
fn limit_changes_take_effect_at_once_without_a_burst() {
    let g = group(10_000);
    let (a, b) = (g.join(3, 0).unwrap(), g.join(1, 0).unwrap());
    let mut chs = [flooding(&g, a, 1), flooding(&g, b, 1)];
    flood(&mut chs, 0, 30 * MS);
    g.set_limit(2_000, 30 * MS).unwrap();
    assert_eq!((g.member_rate(a), g.member_rate(b)), (1_500, 500));
    let n = flood(&mut chs, 30 * MS, 1030 * MS);
    assert!(within(n[0], 1_500, 15) && within(n[1], 500, 15), "{n:?}");
    // 100 changes between 1,000 and 1,000,000 a second, 10 ms apart, ending at 1,000: what
    // passes is what the limits in force allowed plus at most each raised limit's tolerance
    // (2 ms of the new rate, which the slow window left unused), never a burst carried
    // across a change.
    let mut t = 1030 * MS;
    let mut allowed = 0;
    let mut got = 0;
    for k in 0..100 {
        let rate = if k % 2 == 0 { 1_000_000 } else { 1_000 };
        g.set_limit(rate, t).unwrap();
        got += flood(&mut chs, t, t + 10 * MS).iter().sum::<u64>();
        allowed += rate / 100;
        t += 10 * MS;
    }
    assert!(got <= allowed + 50 * 2_000 + 100 * 4, "{got} > {allowed}");
    assert!(got * 100 >= allowed * 90, "{got} << {allowed}");
    let n = flood(&mut chs, t, t + NS);
    assert!(within(n[0] + n[1], 1_000, 15), "{n:?}");
    // No limit: members are not held.
    g.set_limit(0, t + NS).unwrap();
    assert_eq!(g.member_rate(a), 0);
}

#[test]
fn bad_settings_are_refused_and_change_nothing() {
    let g = group(10_000);
    let e = g.set_limit(MAX_RATE + 1, 0).unwrap_err();
    assert!(matches!(e, QosError::AboveMaximum { field: "limit", .. }));
    assert!(e.to_string().starts_with("limit: "));
    assert_eq!(g.limit(), 10_000);
    assert_eq!(g.join(MAX_WEIGHT + 1, 0), Err(QosError::BadWeight(MAX_WEIGHT + 1)));
    assert_eq!(g.set_weight(MemberId(5), 1), Err(QosError::NoMember(5)));
    assert_eq!(g.set_weight(MemberId(MAX_MEMBERS), 1), Err(QosError::NoMember(MAX_MEMBERS)));
    let ids: Vec<_> = (0..MAX_MEMBERS).map(|_| g.join(1, 0).unwrap()).collect();
    assert_eq!(g.join(1, 0), Err(QosError::GroupFull(MAX_MEMBERS)));
    // A place freed is taken again.
    g.leave(ids[7]).unwrap();
    assert_eq!(g.join(2, 0), Ok(ids[7]));
}
