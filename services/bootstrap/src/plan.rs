//! The pure planner: `plan(desired, current rows, context) -> actions`.
//!
//! No I/O and no clock of its own, so it is tested exhaustively. Rules:
//!
//! - **Active row** of a name: the row not marked for retirement and not
//!   replaced by another such row (the newest if several). Every other row
//!   of the name is an *old* row.
//! - **Not desired** (or the datacenter is deleting): every row is retired
//!   (skipped while its retirement is in flight or backing off).
//! - **Desired, no active row**: provision a new row — unless the
//!   datacenter drains (no new installs) or a `depends_on` service is not
//!   running yet (wait).
//! - **Desired, active row**:
//!   - an agent call in flight (lease valid) → skip; a failure backing off
//!     → skip until `next_attempt_time`;
//!   - backend runs exactly the desired spec: running → retire the old rows
//!     if any (the second half of a replace), else noop; otherwise (drift,
//!     an interrupted call) → provision the same instance again (agent
//!     calls are idempotent by instance id);
//!   - backend runs another spec: only images/env differ and the agent can
//!     deploy → update in place; else → replace: a new row (new instance)
//!     is provisioned first and the old one is retired only once the new
//!     one runs;
//!   - never installed: draining → skip; dependencies not running → wait;
//!     never attempted or attempted with this very spec → provision it; an
//!     attempt with another spec may have left backend objects under the
//!     old instance id → a new instance replaces it.
//! - **Paused** (maintenance, offline): every name is skipped, nothing
//!   changes.
//! - A spec that failed to render keeps its name: its installed version is
//!   left alone (skip with the error), never retired for a config mistake.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

use crate::desired::{Desired, DesiredSet};
use crate::model::{Phase, State, Workload};

/// What the plan does about a name (the API's `ActionType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Install (a new row or an existing uninstalled/broken one).
    Provision,
    /// Deploy new images/env in place.
    Update,
    /// Install a new instance that replaces the active one.
    Replace,
    /// Remove a row's workload.
    Retire,
    /// Hold until dependencies run.
    Wait,
    /// Nothing now (in flight, backing off, paused, draining, spec error).
    Skip,
    /// Up to date.
    Noop,
}

/// The concrete step the executor performs.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Insert a row for `desired` and provision it; `replaces` names the
    /// row it supersedes.
    ProvisionNew {
        /// The spec.
        desired: Desired,
        /// Superseded row.
        replaces: Option<String>,
    },
    /// Provision an existing row (first attempt, retry or repair) with
    /// `desired`.
    ProvisionExisting {
        /// The row.
        workload_id: String,
        /// The spec.
        desired: Desired,
    },
    /// Deploy `desired` to a running row.
    Update {
        /// The row.
        workload_id: String,
        /// The spec.
        desired: Desired,
    },
    /// Retire a row.
    Retire {
        /// The row.
        workload_id: String,
    },
    /// Record that `desired` waits for `on` (creating the row if needed).
    Wait {
        /// The row, if one exists.
        workload_id: Option<String>,
        /// The spec.
        desired: Desired,
        /// Unmet dependencies.
        on: Vec<String>,
    },
    /// Nothing to do now.
    Nothing,
}

/// One planned action.
#[derive(Debug, Clone, PartialEq)]
pub struct Action {
    /// Bootstrap service name.
    pub name: String,
    /// Kind, as reported.
    pub kind: Kind,
    /// Why.
    pub reason: String,
    /// Source of the desired spec (empty when not desired).
    pub source: String,
    /// The row the action concerns, if any.
    pub workload_id: Option<String>,
    /// What to execute.
    pub step: Step,
}

/// Everything besides desired and current the planner needs.
#[derive(Debug, Clone)]
pub struct Context {
    /// The datacenter's phase.
    pub phase: Phase,
    /// The current time.
    pub now: DateTime<Utc>,
    /// The agent advertises `deploy`.
    pub can_deploy: bool,
}

fn lease_valid(w: &Workload, now: DateTime<Utc>) -> bool {
    w.state.leased() && w.lease_expire_time.is_some_and(|t| t > now)
}

fn backing_off(w: &Workload, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    (w.state == State::Failed)
        .then_some(w.next_attempt_time)
        .flatten()
        .filter(|t| *t > now)
}

fn act(
    name: &str,
    kind: Kind,
    reason: impl Into<String>,
    source: &str,
    workload_id: Option<&str>,
    step: Step,
) -> Action {
    Action {
        name: name.to_string(),
        kind,
        reason: reason.into(),
        source: source.to_string(),
        workload_id: workload_id.map(str::to_string),
        step,
    }
}

/// The retirement (or why not now) of one row.
fn retire_row(w: &Workload, ctx: &Context, reason: &str) -> Action {
    if lease_valid(w, ctx.now) {
        return act(
            &w.name,
            Kind::Skip,
            "retirement in progress",
            "",
            Some(&w.id),
            Step::Nothing,
        );
    }
    if let Some(t) = backing_off(w, ctx.now) {
        return act(
            &w.name,
            Kind::Skip,
            format!(
                "retirement failed ({}); next attempt at {}",
                w.last_error,
                t.to_rfc3339()
            ),
            "",
            Some(&w.id),
            Step::Nothing,
        );
    }
    act(
        &w.name,
        Kind::Retire,
        reason,
        "",
        Some(&w.id),
        Step::Retire {
            workload_id: w.id.clone(),
        },
    )
}

/// Splits a name's rows into the active row and the old ones.
fn split_rows<'a>(rows: &[&'a Workload]) -> (Option<&'a Workload>, Vec<&'a Workload>) {
    let live: Vec<&Workload> = rows.iter().copied().filter(|w| !w.retire).collect();
    let replaced: BTreeSet<&str> = live.iter().filter_map(|w| w.replaces.as_deref()).collect();
    let active = live
        .iter()
        .copied()
        .filter(|w| !replaced.contains(w.id.as_str()))
        .max_by(|a, b| (a.create_time, &a.id).cmp(&(b.create_time, &b.id)));
    let old = rows
        .iter()
        .copied()
        .filter(|w| Some(w.id.as_str()) != active.map(|a| a.id.as_str()))
        .collect();
    (active, old)
}

/// Computes the actions that move `current` towards `desired`.
pub fn plan(desired: &DesiredSet, current: &[Workload], ctx: &Context) -> Vec<Action> {
    let mut rows_by_name: BTreeMap<&str, Vec<&Workload>> = BTreeMap::new();
    for w in current.iter().filter(|w| w.state != State::Retired) {
        rows_by_name.entry(w.name.as_str()).or_default().push(w);
    }
    // Names that run their desired spec: dependencies are met by these.
    let running: BTreeSet<&str> = rows_by_name
        .iter()
        .filter(|(_, rows)| {
            let (active, _) = split_rows(rows);
            active.is_some_and(|a| a.state == State::Running && a.applied_hash.is_some())
        })
        .map(|(n, _)| *n)
        .collect();

    let deleting = ctx.phase == Phase::Deleting;
    let paused = matches!(ctx.phase, Phase::Maintenance | Phase::Offline);
    let mut actions = Vec::new();
    let mut seen = BTreeSet::new();

    let wanted: Vec<&Desired> = if deleting {
        Vec::new()
    } else {
        desired.items.iter().collect()
    };
    for d in wanted {
        seen.insert(d.name.as_str());
        let rows = rows_by_name
            .get(d.name.as_str())
            .cloned()
            .unwrap_or_default();
        if paused {
            actions.push(paused_action(&d.name, &d.source, &rows, ctx.phase));
            continue;
        }
        actions.extend(plan_desired(d, &rows, &running, ctx));
    }
    if !deleting {
        for e in &desired.errors {
            seen.insert(e.name.as_str());
            let rows = rows_by_name
                .get(e.name.as_str())
                .cloned()
                .unwrap_or_default();
            let (active, _) = split_rows(&rows);
            actions.push(act(
                &e.name,
                Kind::Skip,
                format!("spec error, installed version left as is: {}", e.message),
                &e.source,
                active.map(|a| a.id.as_str()),
                Step::Nothing,
            ));
        }
    }
    for (name, rows) in &rows_by_name {
        if seen.contains(name) {
            continue;
        }
        if paused {
            actions.push(paused_action(name, "", rows, ctx.phase));
            continue;
        }
        let reason = if deleting {
            "datacenter is being deleted"
        } else {
            "no longer in the desired set"
        };
        for w in rows {
            actions.push(retire_row(w, ctx, reason));
        }
    }
    actions
}

fn paused_action(name: &str, source: &str, rows: &[&Workload], phase: Phase) -> Action {
    let (active, _) = split_rows(rows);
    act(
        name,
        Kind::Skip,
        format!("paused: datacenter is in {}", phase.as_str()),
        source,
        active.map(|a| a.id.as_str()),
        Step::Nothing,
    )
}

fn plan_desired(
    d: &Desired,
    rows: &[&Workload],
    running: &BTreeSet<&str>,
    ctx: &Context,
) -> Vec<Action> {
    let (active, old) = split_rows(rows);
    let draining = ctx.phase == Phase::Draining;
    let src = d.source.as_str();
    let unmet: Vec<String> = d
        .spec
        .depends_on
        .iter()
        .filter(|dep| !running.contains(dep.as_str()))
        .cloned()
        .collect();
    let wait = |id: Option<&str>| {
        act(
            &d.name,
            Kind::Wait,
            format!("waiting for {}", unmet.join(", ")),
            src,
            id,
            Step::Wait {
                workload_id: id.map(str::to_string),
                desired: d.clone(),
                on: unmet.clone(),
            },
        )
    };

    let Some(a) = active else {
        if draining {
            return vec![act(
                &d.name,
                Kind::Skip,
                "draining: no new installs",
                src,
                None,
                Step::Nothing,
            )];
        }
        if !unmet.is_empty() {
            return vec![wait(None)];
        }
        return vec![act(
            &d.name,
            Kind::Provision,
            "not installed",
            src,
            None,
            Step::ProvisionNew {
                desired: d.clone(),
                replaces: None,
            },
        )];
    };
    let id = Some(a.id.as_str());

    if lease_valid(a, ctx.now) {
        return vec![act(
            &d.name,
            Kind::Skip,
            format!("{} in progress", a.state),
            src,
            id,
            Step::Nothing,
        )];
    }
    if let Some(t) = backing_off(a, ctx.now) {
        return vec![act(
            &d.name,
            Kind::Skip,
            format!(
                "attempt {} failed ({}); next attempt at {}",
                a.attempts,
                a.last_error,
                t.to_rfc3339()
            ),
            src,
            id,
            Step::Nothing,
        )];
    }
    let provision_existing = |reason: String| {
        act(
            &d.name,
            Kind::Provision,
            reason,
            src,
            id,
            Step::ProvisionExisting {
                workload_id: a.id.clone(),
                desired: d.clone(),
            },
        )
    };
    let replace = |reason: &str| {
        act(
            &d.name,
            Kind::Replace,
            reason,
            src,
            id,
            Step::ProvisionNew {
                desired: d.clone(),
                replaces: Some(a.id.clone()),
            },
        )
    };

    match a.applied_hash.as_deref() {
        Some(h) if h == d.spec_hash => {
            if a.state == State::Running {
                if old.is_empty() {
                    vec![act(
                        &d.name,
                        Kind::Noop,
                        "up to date",
                        src,
                        id,
                        Step::Nothing,
                    )]
                } else {
                    old.iter()
                        .map(|w| {
                            retire_row(w, ctx, &format!("replaced by {}, which is running", a.id))
                        })
                        .collect()
                }
            } else {
                vec![provision_existing(format!(
                    "repair: {} row, provisioning again",
                    a.state
                ))]
            }
        }
        Some(_) => {
            if a.structure_hash == d.structure_hash && ctx.can_deploy {
                vec![act(
                    &d.name,
                    Kind::Update,
                    "image or env changed: deploy in place",
                    src,
                    id,
                    Step::Update {
                        workload_id: a.id.clone(),
                        desired: d.clone(),
                    },
                )]
            } else if a.structure_hash == d.structure_hash {
                vec![replace(
                    "image or env changed and the agent cannot deploy: new instance first, then retire the old",
                )]
            } else {
                vec![replace(
                    "structural change: new instance first, then retire the old",
                )]
            }
        }
        None => {
            if draining {
                return vec![act(
                    &d.name,
                    Kind::Skip,
                    "draining: no new installs",
                    src,
                    id,
                    Step::Nothing,
                )];
            }
            if !unmet.is_empty() {
                return vec![wait(id)];
            }
            let never_attempted = matches!(a.state, State::Pending | State::Waiting);
            if never_attempted || a.spec_hash == d.spec_hash {
                let reason = match a.state {
                    State::Pending | State::Waiting => "install".to_string(),
                    State::Provisioning => {
                        "lease expired: retrying an interrupted install".to_string()
                    }
                    _ => format!("retry after failed attempt {}", a.attempts),
                };
                vec![provision_existing(reason)]
            } else {
                vec![replace(
                    "spec changed before the first install finished: new instance",
                )]
            }
        }
    }
}

#[cfg(test)]
mod tests;
