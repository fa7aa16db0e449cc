#![doc = include_str!("../IMPLEMENTATION.md")]
