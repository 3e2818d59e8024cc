//! The producer table's tests.

use super::*;

fn stamp(id: &str, epoch: u64, seq: u64) -> ProducerStamp {
    ProducerStamp {
        id: id.into(),
        epoch: ProducerEpoch(epoch),
        seq: ProducerSeq(seq),
        claim: false,
    }
}

fn receipt(events: u64) -> Receipt {
    Receipt {
        events: [("v".to_owned(), events)].into(),
        ..Receipt::default()
    }
}

fn input(n: u64) -> InputDigest {
    InputDigest::of(&n.to_le_bytes())
}

/// Stages and commits `seq` with the input `n` and a receipt of `n` events.
fn send(table: &mut ProducerTable, epoch: u64, seq: u64, n: u64) {
    let stamp = stamp("p", epoch, seq);
    assert_eq!(table.check(&stamp, input(n)), Verdict::Next, "seq {seq}");
    table.stage(&stamp, input(n));
    table.committed(&stamp, &receipt(n));
}

#[test]
fn the_rules() {
    let mut table = ProducerTable::default();
    assert_eq!(
        table.check(&stamp("p", 0, 1), input(0)),
        Verdict::OutOfOrder {
            expected: ProducerSeq::FIRST
        }
    );
    send(&mut table, 0, 0, 10);
    assert_eq!(
        table.check(&stamp("p", 0, 0), input(10)),
        Verdict::Duplicate(Some(receipt(10)))
    );
    send(&mut table, 0, 1, 11);
    assert_eq!(
        table.check(&stamp("p", 0, 5), input(0)),
        Verdict::OutOfOrder {
            expected: ProducerSeq(2)
        }
    );
    // A new epoch starts at 0 and fences the old one.
    assert_eq!(
        table.check(&stamp("p", 1, 3), input(0)),
        Verdict::OutOfOrder {
            expected: ProducerSeq::FIRST
        }
    );
    table.stage(&stamp("p", 1, 0), input(0));
    assert_eq!(
        table.check(&stamp("p", 0, 2), input(0)),
        Verdict::Fenced {
            current: ProducerEpoch(1)
        }
    );
    assert_eq!(table.next("p"), Some((ProducerEpoch(1), ProducerSeq(1))));
}

/// A resent older `seq` was answered with an empty receipt: every batch kept answers with
/// its own, and one past them is refused as stale rather than answered with nothing.
#[test]
fn a_duplicate_of_any_kept_batch_gets_its_own_receipt() {
    let mut table = ProducerTable::default();
    let sent = 2 * RECEIPTS_KEPT as u64;
    for seq in 0..sent {
        send(&mut table, 0, seq, 100 + seq);
    }
    let next = ProducerSeq(sent);
    for seq in 0..sent {
        let verdict = table.check(&stamp("p", 0, seq), input(100 + seq));
        match seq >= sent - RECEIPTS_KEPT as u64 {
            true => assert_eq!(verdict, Verdict::Duplicate(Some(receipt(100 + seq)))),
            false => assert_eq!(verdict, Verdict::Stale { next }, "seq {seq}"),
        }
    }
}

/// A producer's batches staged in one group before any of them committed: each gets its own
/// receipt at its commit, and a later duplicate of the first answers with it.
#[test]
fn batches_staged_together_each_get_their_receipt() {
    let mut table = ProducerTable::default();
    let (first, second) = (stamp("p", 0, 0), stamp("p", 0, 1));
    table.stage(&first, input(1));
    table.stage(&second, input(2));
    assert_eq!(table.check(&first, input(1)), Verdict::Duplicate(None));
    table.committed(&first, &receipt(1));
    table.committed(&second, &receipt(2));
    assert_eq!(
        table.check(&first, input(1)),
        Verdict::Duplicate(Some(receipt(1)))
    );
    assert_eq!(
        table.check(&second, input(2)),
        Verdict::Duplicate(Some(receipt(2)))
    );
}

/// A duplicate `seq` with another body was taken for a retry and its data dropped.
#[test]
fn a_used_seq_with_another_input_is_refused() {
    let mut table = ProducerTable::default();
    send(&mut table, 0, 0, 1);
    send(&mut table, 0, 1, 2);
    let next = ProducerSeq(2);
    assert_eq!(
        table.check(&stamp("p", 0, 1), input(3)),
        Verdict::Reused { next }
    );
    assert_eq!(
        table.check(&stamp("p", 0, 0), input(3)),
        Verdict::Reused { next }
    );
}

#[test]
fn a_claim_fences_every_older_holder_and_starts_at_seq_0() {
    let mut table = ProducerTable::default();
    let (first, _) = table.claim("p").unwrap();
    assert_eq!(first, ProducerEpoch(1));
    assert_eq!(table.next("p"), Some((first, ProducerSeq::FIRST)));
    send(&mut table, 1, 0, 5);
    let (second, undo) = table.claim("p").unwrap();
    assert_eq!(second, ProducerEpoch(2));
    assert_eq!(
        table.check(&stamp("p", 1, 1), input(6)),
        Verdict::Fenced { current: second }
    );
    // The new run's first batch is new, whatever the old run sent under seq 0.
    assert_eq!(table.check(&stamp("p", 2, 0), input(5)), Verdict::Next);
    table.undo(undo);
    assert_eq!(table.next("p"), Some((first, ProducerSeq(1))));
}

/// A batch could bring epoch `u64::MAX` and every claim after it stayed there, fencing nobody:
/// unclaimed, the last epoch is refused, and a claim past it takes none.
#[test]
fn the_last_epoch_is_only_claimed_and_no_claim_goes_past_it() {
    let mut table = ProducerTable::default();
    let last = ProducerEpoch::LAST;
    assert_eq!(last.get(), u64::MAX);
    assert_eq!(
        table.check(&stamp("p", u64::MAX, 0), input(0)),
        Verdict::LastEpoch,
        "a new id"
    );
    send(&mut table, 0, 0, 1);
    assert_eq!(
        table.check(&stamp("p", u64::MAX, 0), input(0)),
        Verdict::LastEpoch,
        "a known id"
    );
    // The epoch before the last may be sent: a claim can still fence it, with the last.
    send(&mut table, u64::MAX - 1, 0, 2);
    let (claimed, _) = table.claim("p").unwrap();
    assert_eq!(claimed, last);
    assert_eq!(
        table.check(&stamp("p", u64::MAX - 1, 1), input(3)),
        Verdict::Fenced { current: last }
    );
    // Claimed, it runs.
    send(&mut table, u64::MAX, 0, 4);
    // Then the epoch space is used up: the claim is refused and changes nothing.
    let before = table.clone();
    assert_eq!(table.claim("p").err(), Some(ClaimError::EpochsUsedUp));
    assert_eq!(table, before);
    assert_eq!(table.next("p"), Some((last, ProducerSeq(1))));
    // Another id is not concerned.
    assert_eq!(table.claim("q").unwrap().0, ProducerEpoch(1));
}

#[test]
fn undo_takes_a_stage_back_and_the_encoding_is_canonical() {
    let mut table = ProducerTable::default();
    send(&mut table, 0, 0, 1);
    send(&mut table, 0, 1, 2);
    let before = table.clone();
    let u1 = table.stage(&stamp("p", 0, 2), input(3));
    let u2 = table.stage(&stamp("b", 0, 0), input(0));
    table.undo(u2);
    table.undo(u1);
    assert_eq!(table, before);
    let encoded = rmp_serde::to_vec(&table).unwrap();
    let decoded: ProducerTable = rmp_serde::from_slice(&encoded).unwrap();
    assert_eq!(decoded, table);
    assert_eq!(rmp_serde::to_vec(&decoded).unwrap(), encoded);
}

/// A table written before inputs were digested (no `claimed`, `input`, `earlier`) still
/// reads, and a retry of its last batch is a duplicate.
#[test]
fn an_older_table_reads() {
    #[derive(Serialize)]
    struct Old {
        epoch: u64,
        seq: u64,
        receipt: Option<Receipt>,
        used: u64,
    }
    #[derive(Serialize)]
    struct OldTable {
        clock: u64,
        entries: Vec<(String, Old)>,
    }
    let old = OldTable {
        clock: 3,
        entries: vec![(
            "p".into(),
            Old {
                epoch: 0,
                seq: 2,
                receipt: Some(receipt(4)),
                used: 3,
            },
        )],
    };
    let mut bytes = Vec::new();
    rmp_serde::encode::write_named(&mut bytes, &old).unwrap();
    let table: ProducerTable = rmp_serde::from_slice(&bytes).unwrap();
    assert_eq!(
        table.check(&stamp("p", 0, 2), input(9)),
        Verdict::Duplicate(Some(receipt(4)))
    );
    assert_eq!(table.next("p"), Some((ProducerEpoch(0), ProducerSeq(3))));
}

#[test]
fn past_the_limit_the_least_recent_is_forgotten_and_undo_brings_it_back() {
    let mut table = ProducerTable::default();
    for i in 0..MAX_PRODUCERS {
        table.stage(&stamp(&format!("p{i}"), 0, 0), input(0));
    }
    table.stage(&stamp("p0", 0, 1), input(1)); // p0 is now the most recent
    let before = table.clone();
    let undo = table.stage(&stamp("new", 0, 0), input(0));
    assert_eq!(table.len(), MAX_PRODUCERS);
    assert_eq!(table.next("p1"), None, "the least recent went");
    assert_eq!(table.next("p0"), Some((ProducerEpoch(0), ProducerSeq(2))));
    table.undo(undo);
    assert_eq!(table, before);
}
