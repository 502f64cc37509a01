use super::*;

fn budget(per_day: Option<u64>, total: Option<u64>) -> BudgetConfig {
    BudgetConfig { per_day, total }
}

const DAY: u64 = 86_400_000;

#[test]
fn a_budget_holds_charges_and_refuses_what_it_cannot_pay() {
    let meter = Meter::new(&[], 0, Arc::new(LedgerOnly));
    let b = budget(Some(25), Some(100));
    meter.hold("gw", &b, 10, 0).unwrap();
    meter.hold("gw", &b, 10, 0).unwrap();
    // 20 held, 5 left today.
    match meter.hold("gw", &b, 10, 0) {
        Err(Rejection::BudgetExhausted {
            period, remaining, ..
        }) => assert_eq!((period, remaining), ("per_day", 5)),
        other => panic!("{other:?}"),
    }
    meter.end("gw", 10, true, 0);
    meter.end("gw", 10, false, 0);
    assert_eq!(meter.spent("gw"), (10, 10));
    meter.hold("gw", &b, 10, 0).unwrap();
    meter.end("gw", 10, true, 0);
    // The next day the daily budget is fresh, the total is not.
    for _ in 0..8 {
        if meter.hold("gw", &b, 10, DAY * 3).is_ok() {
            meter.end("gw", 10, true, DAY * 3);
        }
    }
    assert_eq!(meter.spent("gw"), (40, 20));
    let tight = budget(None, Some(45));
    assert!(matches!(
        meter.hold("gw", &tight, 10, DAY * 3),
        Err(Rejection::BudgetExhausted {
            period: "total",
            remaining: 5,
            ..
        })
    ));
    // Another consumer has its own.
    meter.hold("other", &tight, 10, 0).unwrap();
}

#[test]
fn what_the_ledger_says_was_spent_counts() {
    let meter = Meter::new(&[("gw".into(), 90, 20)], 5, Arc::new(LedgerOnly));
    let b = budget(Some(25), Some(100));
    assert!(meter.hold("gw", &b, 10, 5 * DAY).is_err());
    assert!(meter.hold("gw", &b, 5, 5 * DAY).is_ok());
}
