//! Decoding frames built value by value as vLLM's msgspec encoder writes them,
//! in both encodings and every hash form.

use rmpv::Value;

use super::*;

fn s(v: &str) -> Value {
    Value::from(v)
}

fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = rmpv::encode::write_value(&mut out, v);
    out
}

fn batch(events: Vec<Value>) -> Vec<u8> {
    encode(&Value::Array(vec![Value::F64(1.7e9), Value::Array(events)]))
}

fn ints(v: &[i64]) -> Value {
    Value::Array(v.iter().map(|&i| Value::from(i)).collect())
}

#[test]
fn tagged_arrays_of_vllm_0_10() {
    let stored = Value::Array(vec![
        s("BlockStored"),
        ints(&[11, 12]),
        Value::Nil,
        ints(&(0..32).collect::<Vec<_>>()),
        Value::from(16),
        Value::Nil,
        s("GPU"),
    ]);
    let removed = Value::Array(vec![s("BlockRemoved"), ints(&[12]), s("GPU")]);
    let cleared = Value::Array(vec![s("AllBlocksCleared")]);
    let b = decode(&batch(vec![stored, removed, cleared])).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.events.len(), 3);
    assert_eq!(
        b.events[0],
        Event::Stored {
            hashes: vec![11, 12],
            parent: None,
            token_ids: (0..32).collect(),
            block_size: 16,
            lora: false,
            medium: Medium::Gpu,
            salt: None,
        }
    );
    assert_eq!(
        b.events[1],
        Event::Removed {
            hashes: vec![12],
            medium: Medium::Gpu
        }
    );
    assert_eq!(b.events[2], Event::Cleared);
}

#[test]
fn maps_with_a_type_member_of_current_vllm_and_extra_keys_salt() {
    let map =
        |pairs: Vec<(&str, Value)>| Value::Map(pairs.into_iter().map(|(k, v)| (s(k), v)).collect());
    let stored = map(vec![
        ("type", s("BlockStored")),
        (
            "block_hashes",
            Value::Array(vec![Value::Binary(vec![7; 32])]),
        ),
        ("parent_block_hash", Value::Nil),
        ("token_ids", ints(&[5; 16])),
        ("block_size", Value::from(16)),
        ("lora_id", Value::Nil),
        ("medium", s("CPU")),
        ("lora_name", Value::Nil),
        (
            "extra_keys",
            Value::Array(vec![Value::Array(vec![s("salt-a")])]),
        ),
        ("group_idx", Value::from(0)),
    ]);
    let removed = map(vec![
        ("type", s("BlockRemoved")),
        (
            "block_hashes",
            Value::Array(vec![Value::Binary(vec![7; 32])]),
        ),
        ("medium", s("CPU")),
    ]);
    let unknown = map(vec![("type", s("SomethingNew")), ("x", Value::from(1))]);
    let b = decode(&batch(vec![stored, removed, unknown])).unwrap_or_else(|e| panic!("{e}"));
    let Event::Stored {
        hashes,
        medium,
        salt,
        ..
    } = &b.events[0]
    else {
        panic!("{:?}", b.events[0]);
    };
    assert_eq!(*medium, Medium::Cpu);
    assert_eq!(*salt, Some(Some("salt-a".to_owned())));
    let Event::Removed {
        hashes: removed, ..
    } = &b.events[1]
    else {
        panic!("{:?}", b.events[1]);
    };
    assert_eq!(
        hashes, removed,
        "bytes hashes fold the same way in both events"
    );
    assert_eq!(b.events[2], Event::Unknown);
}

#[test]
fn signed_and_unsigned_hashes_and_lora_blocks() {
    let stored = Value::Array(vec![
        s("BlockStored"),
        ints(&[-5, i64::MAX]),
        Value::from(-9),
        ints(&[1; 8]),
        Value::from(4),
        Value::from(3),
        Value::Nil,
    ]);
    let big = Value::Array(vec![
        s("BlockRemoved"),
        Value::Array(vec![Value::from(u64::MAX - 1)]),
    ]);
    let b = decode(&batch(vec![stored, big])).unwrap_or_else(|e| panic!("{e}"));
    let Event::Stored {
        hashes,
        parent,
        lora,
        medium,
        ..
    } = &b.events[0]
    else {
        panic!("{:?}", b.events[0]);
    };
    assert_eq!(hashes, &vec![(-5i64) as u64, i64::MAX as u64]);
    assert_eq!(*parent, Some((-9i64) as u64));
    assert!(*lora);
    assert_eq!(*medium, Medium::Gpu, "no medium reported is the GPU");
    assert_eq!(
        b.events[1],
        Event::Removed {
            hashes: vec![u64::MAX - 1],
            medium: Medium::Gpu
        }
    );
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    assert!(decode(b"").is_err());
    assert!(decode(&[0xc1]).is_err());
    assert_eq!(decode(&encode(&Value::from(3))), Err(WireError::NotABatch));
    // A malformed event inside a good batch is skipped, not fatal.
    let b = decode(&batch(vec![Value::Array(vec![
        s("BlockStored"),
        Value::from(1),
    ])]));
    assert_eq!(b.map(|b| b.events), Ok(vec![Event::Unknown]));
    assert_eq!(seq(&[0, 0, 0, 0, 0, 0, 1, 2]), Ok(258));
    assert_eq!(seq(&[1, 2]), Err(WireError::BadSeq(2)));
}
