//! Exhaustive tests of the planner: every rule of the module docs.

#![allow(clippy::cloned_ref_to_slice_refs)] // `&[spec.clone()]` reads better in tables of cases

use chrono::{DateTime, TimeZone, Utc};
use ctrlplane_proto::bootstrap::v1::{BootstrapServiceSpec, DatacenterInfo};
use ctrlplane_proto::provider::v1::ServiceSpec;

use super::*;
use crate::desired::{Contribution, build};

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0).unwrap()
}

fn ctx(phase: Phase) -> Context {
    Context {
        phase,
        now: t0(),
        can_deploy: true,
    }
}

fn spec(name: &str, image: &str) -> BootstrapServiceSpec {
    BootstrapServiceSpec {
        name: name.into(),
        services: vec![ServiceSpec {
            name: "main".into(),
            image: image.into(),
            command: vec!["run".into()],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn with_deps(mut s: BootstrapServiceSpec, deps: &[&str]) -> BootstrapServiceSpec {
    s.depends_on = deps.iter().map(|d| d.to_string()).collect();
    s
}

fn desired(specs: &[BootstrapServiceSpec]) -> DesiredSet {
    build(&DatacenterInfo::default(), specs, &[])
}

/// A row running exactly `s`.
fn running(id: &str, s: &BootstrapServiceSpec) -> Workload {
    let d = &desired(std::slice::from_ref(s)).items[0];
    Workload {
        id: id.into(),
        datacenter_id: "dc_1".into(),
        tenant_id: String::new(),
        provider_name: "process".into(),
        name: s.name.clone(),
        source: "declared".into(),
        spec: d.spec.clone(),
        spec_hash: d.spec_hash.clone(),
        structure_hash: d.structure_hash.clone(),
        applied_hash: Some(d.spec_hash.clone()),
        retire: false,
        state: State::Running,
        provider_ref: format!("ref-{id}"),
        service_refs: Default::default(),
        last_error: String::new(),
        attempts: 0,
        next_attempt_time: None,
        lease_expire_time: None,
        replaces: None,
        endpoints: Vec::new(),
        usage: None,
        create_time: t0() - chrono::Duration::minutes(10),
        update_time: t0() - chrono::Duration::minutes(10),
    }
}

fn in_state(mut w: Workload, state: State) -> Workload {
    w.state = state;
    w
}

fn never_installed(w: Workload, state: State) -> Workload {
    let mut w = in_state(w, state);
    w.applied_hash = None;
    w.provider_ref.clear();
    w
}

fn leased(mut w: Workload, state: State, secs_from_now: i64) -> Workload {
    w.state = state;
    w.lease_expire_time = Some(t0() + chrono::Duration::seconds(secs_from_now));
    w
}

fn failed(mut w: Workload, attempts: i32, retry_in_secs: i64) -> Workload {
    w.state = State::Failed;
    w.attempts = attempts;
    w.last_error = "boom".into();
    w.next_attempt_time = Some(t0() + chrono::Duration::seconds(retry_in_secs));
    w
}

fn summary(actions: &[Action]) -> Vec<(String, Kind, Option<String>)> {
    actions
        .iter()
        .map(|a| (a.name.clone(), a.kind, a.workload_id.clone()))
        .collect()
}

fn one(actions: &[Action]) -> &Action {
    assert_eq!(actions.len(), 1, "{actions:#?}");
    &actions[0]
}

#[test]
fn nothing_installed_provisions_everything() {
    let a = plan(
        &desired(&[spec("a", "i"), spec("b", "i")]),
        &[],
        &ctx(Phase::Active),
    );
    assert_eq!(
        summary(&a),
        [
            ("a".into(), Kind::Provision, None),
            ("b".into(), Kind::Provision, None)
        ]
    );
    assert!(matches!(
        &a[0].step,
        Step::ProvisionNew { replaces: None, .. }
    ));
    assert_eq!(a[0].source, "declared");
}

#[test]
fn up_to_date_is_noop() {
    let s = spec("a", "i");
    let a = plan(
        &desired(&[s.clone()]),
        &[running("w1", &s)],
        &ctx(Phase::Active),
    );
    assert_eq!(one(&a).kind, Kind::Noop);
    assert_eq!(one(&a).step, Step::Nothing);
}

#[test]
fn removed_from_the_desired_set_is_retired() {
    let (a, b) = (spec("a", "i"), spec("b", "i"));
    let acts = plan(
        &desired(&[a.clone()]),
        &[running("wa", &a), running("wb", &b)],
        &ctx(Phase::Active),
    );
    assert_eq!(
        summary(&acts),
        [
            ("a".into(), Kind::Noop, Some("wa".into())),
            ("b".into(), Kind::Retire, Some("wb".into()))
        ]
    );
    assert_eq!(acts[1].reason, "no longer in the desired set");
}

#[test]
fn image_change_updates_in_place_when_the_agent_deploys() {
    let old = spec("a", "i:1");
    let new = spec("a", "i:2");
    let acts = plan(
        &desired(&[new.clone()]),
        &[running("w1", &old)],
        &ctx(Phase::Active),
    );
    let act = one(&acts);
    assert_eq!(act.kind, Kind::Update);
    assert!(
        matches!(&act.step, Step::Update { workload_id, desired } if workload_id == "w1" && desired.spec.services[0].image == "i:2")
    );

    let mut env = old.clone();
    env.services[0].env.insert("K".into(), "V".into());
    assert_eq!(
        one(&plan(
            &desired(&[env]),
            &[running("w1", &old)],
            &ctx(Phase::Active)
        ))
        .kind,
        Kind::Update
    );

    // Without deploy: replace.
    let mut c = ctx(Phase::Active);
    c.can_deploy = false;
    let acts = plan(&desired(&[new]), &[running("w1", &old)], &c);
    assert_eq!(one(&acts).kind, Kind::Replace);
    assert!(matches!(&one(&acts).step, Step::ProvisionNew { replaces: Some(r), .. } if r == "w1"));
}

#[test]
fn structural_change_replaces_new_first() {
    let old = spec("a", "i");
    let mut new = old.clone();
    new.services[0].command = vec!["other".into()];
    let acts = plan(
        &desired(&[new.clone()]),
        &[running("w1", &old)],
        &ctx(Phase::Active),
    );
    assert_eq!(one(&acts).kind, Kind::Replace);
    assert!(matches!(&one(&acts).step, Step::ProvisionNew { replaces: Some(r), .. } if r == "w1"));

    // The replacement is installing: the old row keeps running (no gap).
    let mut w2 = never_installed(running("w2", &new), State::Provisioning);
    w2.replaces = Some("w1".into());
    w2.create_time = t0();
    let w2 = leased(w2, State::Provisioning, 30);
    let acts = plan(
        &desired(&[new.clone()]),
        &[running("w1", &old), w2.clone()],
        &ctx(Phase::Active),
    );
    assert_eq!(
        summary(&acts),
        [("a".into(), Kind::Skip, Some("w2".into()))]
    );

    // The replacement failed: still no gap, it backs off.
    let w2f = failed(never_installed(w2.clone(), State::Failed), 1, 60);
    let acts = plan(
        &desired(&[new.clone()]),
        &[running("w1", &old), w2f],
        &ctx(Phase::Active),
    );
    assert_eq!(
        summary(&acts),
        [("a".into(), Kind::Skip, Some("w2".into()))]
    );

    // The replacement runs: now the old row is retired.
    let mut w2r = running("w2", &new);
    w2r.replaces = Some("w1".into());
    w2r.create_time = t0();
    let acts = plan(
        &desired(&[new]),
        &[running("w1", &old), w2r],
        &ctx(Phase::Active),
    );
    assert_eq!(
        summary(&acts),
        [("a".into(), Kind::Retire, Some("w1".into()))]
    );
    assert!(
        acts[0].reason.contains("replaced by w2"),
        "{}",
        acts[0].reason
    );
}

#[test]
fn dependencies_wait_until_running() {
    let a = spec("a", "i");
    let b = with_deps(spec("b", "i"), &["a"]);
    let c = with_deps(spec("c", "i"), &["b", "missing"]);
    let acts = plan(
        &desired(&[a.clone(), b.clone(), c.clone()]),
        &[],
        &ctx(Phase::Active),
    );
    assert_eq!(
        summary(&acts),
        [
            ("a".into(), Kind::Provision, None),
            ("b".into(), Kind::Wait, None),
            ("c".into(), Kind::Wait, None)
        ]
    );
    assert_eq!(acts[1].reason, "waiting for a");
    assert_eq!(acts[2].reason, "waiting for b, missing");

    // a installing: b still waits (its row exists now, in WAITING).
    let b_row = never_installed(running("wb", &b), State::Waiting);
    let a_row = leased(
        never_installed(running("wa", &a), State::Provisioning),
        State::Provisioning,
        30,
    );
    let acts = plan(
        &desired(&[a.clone(), b.clone()]),
        &[a_row, b_row.clone()],
        &ctx(Phase::Active),
    );
    assert_eq!(
        summary(&acts)[1],
        ("b".into(), Kind::Wait, Some("wb".into()))
    );

    // a running: b installs, with its existing row.
    let acts = plan(
        &desired(&[a.clone(), b.clone()]),
        &[running("wa", &a), b_row],
        &ctx(Phase::Active),
    );
    assert_eq!(
        summary(&acts)[1],
        ("b".into(), Kind::Provision, Some("wb".into()))
    );
    assert!(
        matches!(&acts[1].step, Step::ProvisionExisting { workload_id, .. } if workload_id == "wb")
    );

    // A running service whose dependency breaks is left running.
    let acts = plan(
        &desired(&[a.clone(), b.clone()]),
        &[failed(running("wa", &a), 1, 60), running("wb", &b)],
        &ctx(Phase::Active),
    );
    assert_eq!(
        summary(&acts)[1],
        ("b".into(), Kind::Noop, Some("wb".into()))
    );
}

#[test]
fn failures_back_off_then_retry() {
    let s = spec("a", "i");
    let row = failed(never_installed(running("w1", &s), State::Failed), 3, 30);
    let acts = plan(
        &desired(&[s.clone()]),
        std::slice::from_ref(&row),
        &ctx(Phase::Active),
    );
    assert_eq!(one(&acts).kind, Kind::Skip);
    assert!(
        one(&acts).reason.contains("attempt 3 failed (boom)"),
        "{}",
        one(&acts).reason
    );

    let mut later = ctx(Phase::Active);
    later.now = t0() + chrono::Duration::seconds(31);
    let acts = plan(&desired(&[s.clone()]), &[row], &later);
    assert_eq!(one(&acts).kind, Kind::Provision);
    assert_eq!(one(&acts).reason, "retry after failed attempt 3");
    assert!(
        matches!(&one(&acts).step, Step::ProvisionExisting { workload_id, .. } if workload_id == "w1")
    );
}

#[test]
fn interrupted_calls_are_retried_after_the_lease() {
    let s = spec("a", "i");
    let row = leased(
        never_installed(running("w1", &s), State::Provisioning),
        State::Provisioning,
        30,
    );
    assert_eq!(
        one(&plan(
            &desired(&[s.clone()]),
            std::slice::from_ref(&row),
            &ctx(Phase::Active)
        ))
        .kind,
        Kind::Skip
    );
    let mut later = ctx(Phase::Active);
    later.now = t0() + chrono::Duration::seconds(31);
    let acts = plan(&desired(&[s.clone()]), &[row], &later);
    assert_eq!(one(&acts).kind, Kind::Provision);
    assert_eq!(
        one(&acts).reason,
        "lease expired: retrying an interrupted install"
    );

    // An interrupted update of a running row: deploy again.
    let old = spec("a", "i:1");
    let new = spec("a", "i:2");
    let mut row = leased(running("w1", &old), State::Provisioning, -1);
    let d = &desired(std::slice::from_ref(&new)).items[0];
    row.spec_hash = d.spec_hash.clone();
    let acts = plan(&desired(&[new]), &[row], &ctx(Phase::Active));
    assert_eq!(one(&acts).kind, Kind::Update);
}

#[test]
fn drift_is_repaired_by_provisioning_again() {
    let s = spec("a", "i");
    let mut row = in_state(running("w1", &s), State::Failed);
    row.last_error = "drift: workload vanished".into();
    row.next_attempt_time = Some(t0());
    let acts = plan(&desired(&[s]), &[row], &ctx(Phase::Active));
    assert_eq!(one(&acts).kind, Kind::Provision);
    assert!(
        one(&acts).reason.starts_with("repair"),
        "{}",
        one(&acts).reason
    );
}

#[test]
fn a_spec_change_before_the_first_install_uses_a_new_instance() {
    let old = spec("a", "i:1");
    let mut new = old.clone();
    new.services[0].command = vec!["x".into()];
    // Attempted with the old spec and failed: the agent may hold objects
    // under w1 with the old spec.
    let row = failed(never_installed(running("w1", &old), State::Failed), 1, -1);
    let acts = plan(&desired(&[new.clone()]), &[row], &ctx(Phase::Active));
    assert_eq!(one(&acts).kind, Kind::Replace);
    // Never attempted (pending): the row is simply provisioned with the new spec.
    let row = never_installed(running("w1", &old), State::Pending);
    let acts = plan(&desired(&[new]), &[row], &ctx(Phase::Active));
    assert_eq!(one(&acts).kind, Kind::Provision);
    assert!(
        matches!(&one(&acts).step, Step::ProvisionExisting { desired, .. } if desired.spec.services[0].command == ["x"])
    );
}

#[test]
fn paused_phases_change_nothing() {
    let (a, b) = (spec("a", "i:2"), spec("b", "i"));
    let current = [running("wa", &spec("a", "i:1")), running("wb", &b)];
    for phase in [Phase::Maintenance, Phase::Offline] {
        let acts = plan(
            &desired(&[a.clone(), spec("c", "i")]),
            &current,
            &ctx(phase),
        );
        assert_eq!(acts.len(), 3, "{acts:#?}");
        for act in &acts {
            assert_eq!(act.kind, Kind::Skip);
            assert_eq!(act.step, Step::Nothing);
            assert!(
                act.reason.starts_with("paused: datacenter is in"),
                "{}",
                act.reason
            );
        }
    }
}

#[test]
fn draining_installs_nothing_new_but_updates_and_retires() {
    let a_old = spec("a", "i:1");
    let a_new = spec("a", "i:2");
    let b = spec("b", "i");
    let pending_c = never_installed(running("wc", &spec("c", "i")), State::Pending);
    let acts = plan(
        &desired(&[a_new, spec("c", "i"), spec("d", "i")]),
        &[running("wa", &a_old), running("wb", &b), pending_c],
        &ctx(Phase::Draining),
    );
    assert_eq!(
        summary(&acts),
        [
            ("a".into(), Kind::Update, Some("wa".into())),
            ("c".into(), Kind::Skip, Some("wc".into())),
            ("d".into(), Kind::Skip, None),
            ("b".into(), Kind::Retire, Some("wb".into())),
        ]
    );
    assert_eq!(acts[2].reason, "draining: no new installs");
}

#[test]
fn deleting_retires_everything() {
    let (a, b) = (spec("a", "i"), spec("b", "i"));
    let retiring = leased(
        {
            let mut w = running("wb", &b);
            w.retire = true;
            w
        },
        State::Retiring,
        30,
    );
    let acts = plan(
        &desired(&[a.clone(), b.clone()]),
        &[running("wa", &a), retiring],
        &ctx(Phase::Deleting),
    );
    assert_eq!(
        summary(&acts),
        [
            ("a".into(), Kind::Retire, Some("wa".into())),
            ("b".into(), Kind::Skip, Some("wb".into()))
        ]
    );
    assert_eq!(acts[0].reason, "datacenter is being deleted");
    assert_eq!(acts[1].reason, "retirement in progress");
    // Nothing left: nothing to do (the service then purges).
    assert!(plan(&desired(&[a]), &[], &ctx(Phase::Deleting)).is_empty());
}

#[test]
fn failed_retirements_back_off_and_never_duplicate_rows() {
    let b = spec("b", "i");
    let mut row = failed(running("wb", &b), 2, 45);
    row.retire = true;
    let acts = plan(
        &desired(&[]),
        std::slice::from_ref(&row),
        &ctx(Phase::Active),
    );
    assert_eq!(one(&acts).kind, Kind::Skip);
    assert!(
        one(&acts).reason.starts_with("retirement failed (boom)"),
        "{}",
        one(&acts).reason
    );
    let mut later = ctx(Phase::Active);
    later.now = t0() + chrono::Duration::seconds(46);
    assert_eq!(
        one(&plan(&desired(&[]), std::slice::from_ref(&row), &later)).kind,
        Kind::Retire
    );

    // Re-added while its old row is still retiring: a fresh row is
    // provisioned next to it (the retiring one is not "active"), exactly one.
    let acts = plan(&desired(&[b]), &[row], &later);
    assert_eq!(
        summary(&acts),
        [("b".into(), Kind::Provision, None)],
        "the marked row is excluded from active, not retired twice"
    );
}

#[test]
fn spec_errors_leave_the_installed_version_alone() {
    let mut bad = spec("a", "i:2");
    bad.services[0]
        .env
        .insert("X".into(), "${datacenter.nope}".into());
    let set = desired(&[bad]);
    assert_eq!(set.errors.len(), 1);
    let acts = plan(
        &set,
        &[running("wa", &spec("a", "i:1"))],
        &ctx(Phase::Active),
    );
    let act = one(&acts);
    assert_eq!(
        (act.kind, act.workload_id.as_deref()),
        (Kind::Skip, Some("wa"))
    );
    assert!(act.reason.contains("unknown variable"), "{}", act.reason);
}

#[test]
fn retired_rows_are_ignored_and_strays_retired_once_active_runs() {
    let a = spec("a", "i");
    let gone = in_state(running("w0", &a), State::Retired);
    let mut stray = running("w1", &a);
    stray.create_time = t0() - chrono::Duration::minutes(20);
    let newest = running("w2", &a);
    let acts = plan(
        &desired(std::slice::from_ref(&a)),
        &[gone, stray, newest],
        &ctx(Phase::Active),
    );
    assert_eq!(
        summary(&acts),
        [("a".into(), Kind::Retire, Some("w1".into()))]
    );
}

#[test]
fn hooks_and_declared_share_one_plan() {
    let dc = DatacenterInfo::default();
    let set = build(
        &dc,
        &[spec("logs", "declared")],
        &[Contribution {
            hook: "certs".into(),
            specs: vec![spec("cert-manager", "cm"), spec("logs", "hook")],
        }],
    );
    let acts = plan(&set, &[], &ctx(Phase::Active));
    let got: Vec<(&str, &str)> = acts
        .iter()
        .map(|a| (a.name.as_str(), a.source.as_str()))
        .collect();
    assert_eq!(got, [("logs", "declared"), ("cert-manager", "certs")]);
}
