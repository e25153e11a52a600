//! The Responses API's store: each response's conversation and object, kept
//! on this instance only (bounded, oldest dropped first), as vLLM keeps them.
//! [`crate::server::SimServer`] holds one; [`crate::responses`] reads and fills it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;

/// Conversations kept per instance.
const KEEP: usize = 4096;

/// A stored response: its conversation so far (chat turns) and its object.
pub(crate) type Stored = (Vec<Value>, Value);

/// Stored responses by id, and their ids oldest first.
#[derive(Debug, Default)]
pub(crate) struct Store {
    inner: Mutex<(HashMap<String, Stored>, VecDeque<String>)>,
}

impl Store {
    pub(crate) fn get(&self, id: &str) -> Option<Stored> {
        let g = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.0.get(id).cloned()
    }

    pub(crate) fn put(&self, id: String, turns: Vec<Value>, object: Value) {
        let mut g = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.1.push_back(id.clone());
        g.0.insert(id, (turns, object));
        while g.1.len() > KEEP {
            if let Some(old) = g.1.pop_front() {
                g.0.remove(&old);
            }
        }
    }
}
