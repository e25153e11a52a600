//! Decoding our payloads with `rmpv` into the shapes vLLM's msgspec structs have.

use rmpv::Value;

use super::*;

fn decode(bytes: &[u8]) -> Value {
    rmpv::decode::read_value(&mut &bytes[..]).unwrap()
}

fn events() -> Vec<KvEvent> {
    vec![
        KvEvent::Stored {
            hashes: vec![u64::MAX, 7],
            parent: None,
            token_ids: vec![1, 2, 3, 4],
            salt: Some("tenant".into()),
        },
        KvEvent::Stored {
            hashes: vec![9],
            parent: Some(7),
            token_ids: vec![5, 6],
            salt: None,
        },
        KvEvent::Removed { hashes: vec![9] },
    ]
}

fn wire(encoding: EventEncoding, hashes: HashForm) -> Wire {
    Wire {
        encoding,
        hashes,
        block_size: 2,
    }
}

fn field<'a>(map: &'a Value, key: &str) -> &'a Value {
    let entries = map.as_map().unwrap();
    let found = entries.iter().find(|(k, _)| k.as_str() == Some(key));
    &found.unwrap_or_else(|| panic!("no {key} in {map}")).1
}

#[test]
fn array_encoding_is_tagged_and_positional() {
    let bytes = batch(&wire(EventEncoding::Array, HashForm::Int), 12.5, &events()).unwrap();
    let v = decode(&bytes);
    let top = v.as_array().unwrap();
    assert_eq!(top.len(), 2);
    assert_eq!(top[0].as_f64(), Some(12.5));
    let evs = top[1].as_array().unwrap();
    let stored = evs[0].as_array().unwrap();
    assert_eq!(stored.len(), 7);
    assert_eq!(stored[0].as_str(), Some("BlockStored"));
    let hashes: Vec<u64> = stored[1]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_u64().unwrap())
        .collect();
    assert_eq!(hashes, vec![u64::MAX, 7]);
    assert!(stored[2].is_nil());
    let ids: Vec<u64> = stored[3]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![1, 2, 3, 4]);
    assert_eq!(stored[4].as_u64(), Some(2));
    assert!(stored[5].is_nil());
    assert_eq!(stored[6].as_str(), Some("GPU"));
    assert_eq!(evs[1].as_array().unwrap()[2].as_u64(), Some(7), "parent");
    let removed = evs[2].as_array().unwrap();
    assert_eq!(removed[0].as_str(), Some("BlockRemoved"));
    assert_eq!(removed[1].as_array().unwrap()[0].as_u64(), Some(9));
    assert_eq!(removed[2].as_str(), Some("GPU"));
}

#[test]
fn map_encoding_has_vllm_field_names_and_extra_keys_only_when_salted() {
    let bytes = batch(
        &wire(EventEncoding::Map, HashForm::SignedInt),
        1.0,
        &events(),
    )
    .unwrap();
    let v = decode(&bytes);
    let evs = v.as_array().unwrap()[1].as_array().unwrap();
    let first = &evs[0];
    assert_eq!(field(first, "type").as_str(), Some("BlockStored"));
    let hashes = field(first, "block_hashes").as_array().unwrap();
    assert_eq!(
        hashes[0].as_i64(),
        Some(-1),
        "u64::MAX as Python's signed hash"
    );
    assert_eq!(field(first, "block_size").as_u64(), Some(2));
    assert_eq!(field(first, "medium").as_str(), Some("GPU"));
    assert!(field(first, "lora_id").is_nil() && field(first, "lora_name").is_nil());
    let extra = field(first, "extra_keys").as_array().unwrap();
    assert_eq!(extra.len(), 2);
    assert_eq!(extra[0].as_array().unwrap()[0].as_str(), Some("tenant"));
    assert!(extra[1].is_nil());
    let second = evs[1].as_map().unwrap();
    assert!(second.iter().all(|(k, _)| k.as_str() != Some("extra_keys")));
    assert_eq!(field(&evs[1], "parent_block_hash").as_i64(), Some(7));
    assert_eq!(field(&evs[2], "type").as_str(), Some("BlockRemoved"));
    assert_eq!(evs[2].as_map().unwrap().len(), 3);
}

#[test]
fn byte_hashes_are_32_bytes_and_distinct() {
    let bytes = batch(&wire(EventEncoding::Map, HashForm::Bytes), 1.0, &events()).unwrap();
    let v = decode(&bytes);
    let evs = v.as_array().unwrap()[1].as_array().unwrap();
    let hashes = field(&evs[0], "block_hashes").as_array().unwrap();
    let (a, b) = (hashes[0].as_slice().unwrap(), hashes[1].as_slice().unwrap());
    assert_eq!((a.len(), b.len()), (32, 32));
    assert_ne!(a, b);
    assert_eq!(
        field(&evs[1], "parent_block_hash").as_slice(),
        Some(b),
        "parent links by value"
    );
    assert_eq!(&b[..8], &7u64.to_be_bytes());
}
