use std::time::Duration;

use super::*;

#[test]
fn sizes_parse_with_binary_suffixes() {
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("4k"), Ok(4096));
    assert_eq!(parse_size("4K"), Ok(4096));
    assert_eq!(parse_size("4KiB"), Ok(4096));
    assert_eq!(parse_size("1M"), Ok(1 << 20));
    assert_eq!(parse_size("2g"), Ok(2 << 30));
    assert!(parse_size("four").is_err());
    assert!(parse_size("").is_err());
    assert!(parse_size("99999999999T").is_err());
}

#[test]
fn durations_parse() {
    assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
    assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    assert!(parse_duration("-1").is_err());
    assert!(parse_duration("soon").is_err());
}

#[test]
fn patterns_round_trip() {
    for p in [Pattern::RandRead, Pattern::RandWrite, Pattern::Read, Pattern::Write, Pattern::RandRw] {
        assert_eq!(p.as_str().parse::<Pattern>(), Ok(p));
    }
    assert!("randomread".parse::<Pattern>().is_err());
    assert!(Pattern::RandRw.is_random());
    assert!(!Pattern::Write.is_random());
}

#[test]
fn spec_validation_rejects_nonsense() {
    let ok = LoadSpec::new("/nonexistent");
    assert!(ok.validate().is_ok());
    let mut s = ok.clone();
    s.block_size = 1000;
    assert!(matches!(s.validate(), Err(LoadError::InvalidSpec(_))));
    let mut s = ok.clone();
    s.queue_depth = 0;
    assert!(s.validate().is_err());
    let mut s = ok.clone();
    s.num_queues = 0;
    assert!(s.validate().is_err());
    let mut s = ok.clone();
    s.duration = Duration::ZERO;
    assert!(s.validate().is_err());
    let mut s = ok.clone();
    s.read_percent = 101;
    assert!(s.validate().is_err());
    let mut s = ok.clone();
    s.region = Some(Region { offset: 0, len: 512 });
    assert!(s.validate().is_err());
    let mut s = ok.clone();
    s.pattern = Pattern::Write;
    s.stride = Some(1 << 20);
    assert!(s.validate().is_ok());
    s.stride = Some(2048);
    assert!(s.validate().is_err());
    s.stride = Some(4096 + 100);
    assert!(s.validate().is_err());
    let mut s = ok.clone();
    s.stride = Some(1 << 20);
    assert!(s.validate().is_err(), "randread takes no stride");
    let mut s = ok.clone();
    s.max_ios = Some(0);
    assert!(s.validate().is_err());
    let mut s = ok;
    s.rate_iops = Some(0);
    assert!(s.validate().is_err());
}

#[test]
fn connecting_to_a_missing_socket_fails_cleanly() {
    let mut spec = LoadSpec::new("/nonexistent/fp-load-test.sock");
    spec.duration = Duration::from_millis(10);
    match run(&spec) {
        Err(LoadError::Blkio { op, errno, .. }) => {
            assert_eq!(op, "connect");
            assert!(errno > 0);
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
}

#[test]
fn pinning_to_an_absurd_cpu_is_an_error() {
    assert!(matches!(pin_current_thread(1 << 20), Err(LoadError::InvalidSpec(_))));
}

#[test]
fn wakeups_report_completions_per_wakeup_and_per_notification() {
    let w = Wakeups { wakeups: 40, notifications: 50 };
    let j = w.to_json(2000);
    assert_eq!(j["wakeups"], 40);
    assert_eq!(j["notifications"], 50);
    assert_eq!(j["completions_per_wakeup"], 50.0);
    assert_eq!(j["completions_per_notification"], 40.0);
    // No wake-up at all (nothing completed, or every completion found by polling): no ratio.
    let j = Wakeups::default().to_json(10);
    assert!(j["completions_per_wakeup"].is_null() && j["completions_per_notification"].is_null());
}

#[test]
fn hugetlb_belongs_to_the_frontend() {
    let mut s = LoadSpec::new("/nonexistent");
    s.hugetlb = true;
    assert!(matches!(s.validate(), Err(LoadError::InvalidSpec(_))));
    s.frontend = true;
    assert!(s.validate().is_ok());
}
