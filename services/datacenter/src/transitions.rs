//! The datacenter status transition table.
//!
//! ```text
//! active      → maintenance | draining | offline
//! maintenance → active | draining | offline
//! draining    → offline | active
//! offline     → active | maintenance
//! any         → deleting   (DeleteDatacenter only)
//! ```
//! Deleting is terminal: the row is purged once nothing is left on it.

use crate::model::Status;

/// Whether `SetDatacenterStatus` may move a datacenter from `from` to `to`.
/// Moves into `Deleting` go through `DeleteDatacenter` and are not allowed
/// here.
pub fn allowed(from: Status, to: Status) -> bool {
    use Status::*;
    matches!(
        (from, to),
        (Active, Maintenance | Draining | Offline)
            | (Maintenance, Active | Draining | Offline)
            | (Draining, Offline | Active)
            | (Offline, Active | Maintenance)
    )
}

/// Whether `DeleteDatacenter` may move a datacenter in `from` to deleting.
pub fn deletable(from: Status) -> bool {
    from != Status::Deleting
}

#[cfg(test)]
mod tests {
    use super::*;
    use Status::*;

    /// The whole table: every (from, to) pair with its expected answer.
    #[test]
    fn whole_table() {
        let expected_allowed = [
            (Active, Maintenance),
            (Active, Draining),
            (Active, Offline),
            (Maintenance, Active),
            (Maintenance, Draining),
            (Maintenance, Offline),
            (Draining, Offline),
            (Draining, Active),
            (Offline, Active),
            (Offline, Maintenance),
        ];
        let mut checked = 0;
        for from in Status::ALL {
            for to in Status::ALL {
                let want = expected_allowed.contains(&(from, to));
                assert_eq!(allowed(from, to), want, "{from} -> {to}");
                checked += 1;
            }
        }
        assert_eq!(checked, 25);
    }

    #[test]
    fn nothing_leaves_deleting_and_only_delete_enters_it() {
        for s in Status::ALL {
            assert!(!allowed(Deleting, s));
            assert!(!allowed(s, Deleting));
            assert_eq!(deletable(s), s != Deleting);
        }
    }
}
