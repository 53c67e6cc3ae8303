//! The machinery behind the one declaration of every system event's payload
//! (`schema.rs`): the kinds of field a payload may have, and the macro that turns the
//! declaration into the emitters' payload types, the decoded [`EventData`] with its
//! slot decoding, and the field list that JSON and NTFF arguments are written from and
//! read back through.
//!
//! A field is one of six kinds, each stored in its own way in a slot (`FORMAT.md`,
//! "System event payload"):
//!
//! | kind | emitted as | decoded as | stored |
//! |---|---|---|---|
//! | `word(N, T)` | `T` (`u64`, `u32`, `i64` or `i32`) | `T` | argument word `N` |
//! | `string` | a string id ([`StringId`]) | `String` | the record's string id (one per payload) |
//! | `status` | `Option<u32>` (`NRT_STATUS`) | `Option<i32>` | argument word 3, marked as present |
//! | `host_ticks(N)` | host ticks | host nanoseconds | argument word `N` |
//! | `code(N, SHIFT, E)` | the enum `E` | its name (`&'static str`) | bits `SHIFT..SHIFT + 8` of word `N` |
//! | `half(N, SHIFT)` | `u32` | `u32` | bits `SHIFT..SHIFT + 32` of word `N` |
//!
//! A field's JSON and NTFF key is its name unless the declaration gives one (`as "key"`).
//!
//! [`EventData`]: super::EventData

use serde::{Serialize, Serializer};

use super::EventType;
use crate::kinds::{CollectiveAlgorithm, CollectiveOp};

/// A string table id, as [`crate::DatastoreWriter::intern`] returns it.
pub type StringId = u32;

/// One field of a decoded payload as JSON and NTFF arguments carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValue<'a> {
    U64(u64),
    I64(i64),
    Str(&'a str),
}

impl Serialize for FieldValue<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match *self {
            FieldValue::U64(v) => serializer.serialize_u64(v),
            FieldValue::I64(v) => serializer.serialize_i64(v),
            FieldValue::Str(s) => serializer.serialize_str(s),
        }
    }
}

/// What a payload puts in its slot besides the common fields: the string id and the
/// four argument words, and whether the last of them holds a status (the record's flag
/// [`FLAG_STATUS`](crate::record::FLAG_STATUS)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Slots {
    pub string_id: StringId,
    pub args: [u64; 4],
    pub status: bool,
}

/// A system event's payload as emitted: one of the types in [`super::payload`].
pub trait Payload: Copy {
    /// The event types that carry it.
    const EVENT_TYPES: &'static [EventType];

    /// Its slot words.
    fn slots(&self) -> Slots;
}

/// A number stored whole in one argument word.
pub trait Word: Copy {
    fn to_word(self) -> u64;
    fn from_word(word: u64) -> Self;
    fn value(self) -> FieldValue<'static>;
    fn from_value(value: FieldValue<'_>) -> Option<Self>;
    /// A value unlike zero and unlike other fields' (round-trip tests).
    fn sample(seed: u64) -> Self;
}

impl Word for u64 {
    #[inline(always)]
    fn to_word(self) -> u64 {
        self
    }
    fn from_word(word: u64) -> u64 {
        word
    }
    fn value(self) -> FieldValue<'static> {
        FieldValue::U64(self)
    }
    fn from_value(value: FieldValue<'_>) -> Option<u64> {
        match value {
            FieldValue::U64(v) => Some(v),
            _ => None,
        }
    }
    fn sample(seed: u64) -> u64 {
        u64::MAX - seed
    }
}

impl Word for u32 {
    #[inline(always)]
    fn to_word(self) -> u64 {
        u64::from(self)
    }
    fn from_word(word: u64) -> u32 {
        word as u32
    }
    fn value(self) -> FieldValue<'static> {
        FieldValue::U64(u64::from(self))
    }
    fn from_value(value: FieldValue<'_>) -> Option<u32> {
        u32::try_from(u64::from_value(value)?).ok()
    }
    fn sample(seed: u64) -> u32 {
        u32::MAX - seed as u32
    }
}

impl Word for i64 {
    #[inline(always)]
    fn to_word(self) -> u64 {
        self as u64
    }
    fn from_word(word: u64) -> i64 {
        word as i64
    }
    fn value(self) -> FieldValue<'static> {
        FieldValue::I64(self)
    }
    fn from_value(value: FieldValue<'_>) -> Option<i64> {
        match value {
            FieldValue::I64(v) => Some(v),
            FieldValue::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }
    fn sample(seed: u64) -> i64 {
        -1_000_000_007 - seed as i64
    }
}

impl Word for i32 {
    #[inline(always)]
    fn to_word(self) -> u64 {
        u64::from(self as u32)
    }
    fn from_word(word: u64) -> i32 {
        word as u32 as i32
    }
    fn value(self) -> FieldValue<'static> {
        FieldValue::I64(i64::from(self))
    }
    fn from_value(value: FieldValue<'_>) -> Option<i32> {
        match value {
            FieldValue::I64(v) => i32::try_from(v).ok(),
            _ => None,
        }
    }
    fn sample(seed: u64) -> i32 {
        -1 - seed as i32
    }
}

/// An enum stored as an 8-bit code and decoded as its name.
pub trait Code: Copy {
    fn code(self) -> u64;
    /// The name of the value `code` stands for (`unknown` for none).
    fn name_of_code(code: u64) -> &'static str;
    /// The name among those [`Code::name_of_code`] gives, as a `'static` string.
    fn known_name(name: &str) -> Option<&'static str> {
        (0..=0xff).map(Self::name_of_code).find(|known| *known == name)
    }
    /// A value other than the first (round-trip tests).
    fn sample() -> Self;
}

impl Code for CollectiveOp {
    #[inline(always)]
    fn code(self) -> u64 {
        self as u64
    }
    fn name_of_code(code: u64) -> &'static str {
        CollectiveOp::name_of_code(code)
    }
    fn sample() -> CollectiveOp {
        CollectiveOp::ReduceScatter
    }
}

impl Code for CollectiveAlgorithm {
    #[inline(always)]
    fn code(self) -> u64 {
        CollectiveAlgorithm::code(self)
    }
    fn name_of_code(code: u64) -> &'static str {
        CollectiveAlgorithm::name_of_code(code)
    }
    fn sample() -> CollectiveAlgorithm {
        CollectiveAlgorithm::AllToAll
    }
}

/// One field kind's part of each generated item (see the table in the module docs).
macro_rules! field {
    // The type emitters pass.
    (emitted word($n:literal, $t:ty)) => { $t };
    (emitted string) => { $crate::event::StringId };
    (emitted status) => { Option<u32> };
    (emitted host_ticks($n:literal)) => { u64 };
    (emitted code($n:literal, $shift:literal, $e:ty)) => { $e };
    (emitted half($n:literal, $shift:literal)) => { u32 };

    // The type readers see.
    (decoded word($n:literal, $t:ty)) => { $t };
    (decoded string) => { String };
    (decoded status) => { Option<i32> };
    (decoded host_ticks($n:literal)) => { u64 };
    (decoded code($n:literal, $shift:literal, $e:ty)) => { &'static str };
    (decoded half($n:literal, $shift:literal)) => { u32 };

    // Stores an emitted value into `$slots`.
    (encode $slots:ident, $v:expr, word($n:literal, $t:ty)) => {
        $slots.args[$n] |= $crate::event::Word::to_word($v)
    };
    (encode $slots:ident, $v:expr, string) => {
        $slots.string_id = $v
    };
    (encode $slots:ident, $v:expr, status) => {
        if let Some(code) = $v {
            $slots.args[3] |= u64::from(code);
            $slots.status = true;
        }
    };
    (encode $slots:ident, $v:expr, host_ticks($n:literal)) => {
        $slots.args[$n] |= $v
    };
    (encode $slots:ident, $v:expr, code($n:literal, $shift:literal, $e:ty)) => {
        $slots.args[$n] |= ($crate::event::Code::code($v) & 0xff) << $shift
    };
    (encode $slots:ident, $v:expr, half($n:literal, $shift:literal)) => {
        $slots.args[$n] |= u64::from($v) << $shift
    };

    // Reads the decoded value from a record's slots.
    (decode $slots:ident, $string:ident, $host_ns:ident, word($n:literal, $t:ty)) => {
        <$t as $crate::event::Word>::from_word($slots.args[$n])
    };
    (decode $slots:ident, $string:ident, $host_ns:ident, string) => {
        $string($slots.string_id)
    };
    (decode $slots:ident, $string:ident, $host_ns:ident, status) => {
        $slots.status.then_some($slots.args[3] as u32 as i32)
    };
    (decode $slots:ident, $string:ident, $host_ns:ident, host_ticks($n:literal)) => {
        $host_ns($slots.args[$n])
    };
    (decode $slots:ident, $string:ident, $host_ns:ident, code($n:literal, $shift:literal, $e:ty)) => {
        <$e as $crate::event::Code>::name_of_code($slots.args[$n] >> $shift & 0xff)
    };
    (decode $slots:ident, $string:ident, $host_ns:ident, half($n:literal, $shift:literal)) => {
        ($slots.args[$n] >> $shift) as u32
    };

    // Hands a decoded value to `$f` under `$key` (an absent status is left out).
    (visit $f:ident, $key:expr, $v:expr, word($n:literal, $t:ty)) => {
        $f($key, $crate::event::Word::value(*$v))?
    };
    (visit $f:ident, $key:expr, $v:expr, string) => {
        $f($key, $crate::event::FieldValue::Str($v))?
    };
    (visit $f:ident, $key:expr, $v:expr, status) => {
        if let Some(status) = $v {
            $f($key, $crate::event::FieldValue::I64(i64::from(*status)))?
        }
    };
    (visit $f:ident, $key:expr, $v:expr, host_ticks($n:literal)) => {
        $f($key, $crate::event::FieldValue::U64(*$v))?
    };
    (visit $f:ident, $key:expr, $v:expr, code($n:literal, $shift:literal, $e:ty)) => {
        $f($key, $crate::event::FieldValue::Str($v))?
    };
    (visit $f:ident, $key:expr, $v:expr, half($n:literal, $shift:literal)) => {
        $f($key, $crate::event::FieldValue::U64(u64::from(*$v)))?
    };

    // Reads the decoded value back from `$get` (inside a function returning `Option`).
    (parse $get:ident, $key:expr, word($n:literal, $t:ty)) => {
        <$t as $crate::event::Word>::from_value($get($key)?)?
    };
    (parse $get:ident, $key:expr, string) => {
        match $get($key)? {
            $crate::event::FieldValue::Str(s) => s.to_owned(),
            _ => return None,
        }
    };
    (parse $get:ident, $key:expr, status) => {
        match $get($key) {
            Some($crate::event::FieldValue::I64(v)) => i32::try_from(v).ok(),
            _ => None,
        }
    };
    (parse $get:ident, $key:expr, host_ticks($n:literal)) => {
        <u64 as $crate::event::Word>::from_value($get($key)?)?
    };
    (parse $get:ident, $key:expr, code($n:literal, $shift:literal, $e:ty)) => {
        match $get($key)? {
            $crate::event::FieldValue::Str(s) => <$e as $crate::event::Code>::known_name(s)?,
            _ => return None,
        }
    };
    (parse $get:ident, $key:expr, half($n:literal, $shift:literal)) => {
        <u32 as $crate::event::Word>::from_value($get($key)?)?
    };

    // An emitted value for round-trip tests: unlike zero and unlike the other fields'.
    (sample $seed:expr, word($n:literal, $t:ty)) => {
        <$t as $crate::event::Word>::sample($seed)
    };
    (sample $seed:expr, string) => {
        1000 + $seed as u32
    };
    (sample $seed:expr, status) => {
        Some(2000 + $seed as u32)
    };
    (sample $seed:expr, host_ticks($n:literal)) => {
        3000 + $seed
    };
    (sample $seed:expr, code($n:literal, $shift:literal, $e:ty)) => {
        <$e as $crate::event::Code>::sample()
    };
    (sample $seed:expr, half($n:literal, $shift:literal)) => {
        0x8000_0000 | 4000 + $seed as u32
    };

    // What an emitted value decodes to, found without the slots.
    (expect $v:expr, $string:ident, $host_ns:ident, word($n:literal, $t:ty)) => { $v };
    (expect $v:expr, $string:ident, $host_ns:ident, string) => { $string($v) };
    (expect $v:expr, $string:ident, $host_ns:ident, status) => { $v.map(|code| code as i32) };
    (expect $v:expr, $string:ident, $host_ns:ident, host_ticks($n:literal)) => { $host_ns($v) };
    (expect $v:expr, $string:ident, $host_ns:ident, code($n:literal, $shift:literal, $e:ty)) => {
        <$e as $crate::event::Code>::name_of_code($crate::event::Code::code($v))
    };
    (expect $v:expr, $string:ident, $host_ns:ident, half($n:literal, $shift:literal)) => { $v };

    // The key: the field's name, or the one the declaration gives.
    (key $field:ident) => { stringify!($field) };
    (key $field:ident $key:literal) => { $key };
}

/// Declares every system event's payload once; see `schema.rs` for the declaration
/// and the module docs for the field kinds.
macro_rules! system_payloads {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident for $($event:ident),+ {
            $(
                $(#[doc = $field_doc:literal])*
                $field:ident $(as $key:literal)? : $kind:ident $(($($param:tt)*))?
            ),* $(,)?
        }
    )*) => {
        /// What a system event says beyond its common fields; the variant follows the
        /// type (declared in `event/schema.rs`).
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum EventData {
            $(
                $(#[doc = $doc])*
                $name {
                    $(
                        $(#[doc = $field_doc])*
                        $field: $crate::event::fields::field!(decoded $kind $(($($param)*))?),
                    )*
                },
            )*
        }

        /// The payloads emitters pass, one type per [`EventData`] variant, with the
        /// same fields as they are stored (string ids, host ticks, codes).
        pub mod payload {
            #[allow(unused_imports)]
            use super::*;
            use $crate::event::{EventType, Payload, Slots};
            $(
                $(#[doc = $doc])*
                #[derive(Debug, Clone, Copy, PartialEq, Eq)]
                pub struct $name {
                    $(
                        $(#[doc = $field_doc])*
                        pub $field: $crate::event::fields::field!(emitted $kind $(($($param)*))?),
                    )*
                }

                impl Payload for $name {
                    const EVENT_TYPES: &'static [EventType] = &[$(EventType::$event),+];

                    #[inline(always)]
                    #[allow(unused_mut)]
                    fn slots(&self) -> Slots {
                        let mut slots = Slots::default();
                        $( $crate::event::fields::field!(encode slots, self.$field, $kind $(($($param)*))?); )*
                        slots
                    }
                }
            )*
        }

        impl EventData {
            /// The payload of an event of `event_type` stored in `slots`; `string`
            /// resolves string ids and `host_ns` converts host ticks.
            pub(crate) fn from_slots(
                event_type: EventType,
                slots: &$crate::event::Slots,
                string: &mut dyn FnMut($crate::event::StringId) -> String,
                host_ns: &dyn Fn(u64) -> u64,
            ) -> EventData {
                match event_type {
                    $(
                        $(EventType::$event)|+ => EventData::$name {
                            $( $field: $crate::event::fields::field!(
                                decode slots, string, host_ns, $kind $(($($param)*))?
                            ), )*
                        },
                    )*
                }
            }

            /// Hands each field to `f` as its key and value, in declaration order (an
            /// absent status is left out): what JSON objects and NTFF arguments hold.
            pub fn try_for_each_field<E>(
                &self,
                mut f: impl FnMut(&'static str, $crate::event::FieldValue<'_>) -> Result<(), E>,
            ) -> Result<(), E> {
                match self {
                    $(
                        EventData::$name { $($field),* } => {
                            $( $crate::event::fields::field!(
                                visit f, $crate::event::fields::field!(key $field $($key)?), $field,
                                $kind $(($($param)*))?
                            ); )*
                        }
                    )*
                }
                Ok(())
            }

            /// The payload of an event of `event_type` from its fields by key (`None`
            /// when one is missing or of another kind; an absent status is `None`).
            pub fn from_fields<'a>(
                event_type: EventType,
                get: &mut dyn FnMut(&str) -> Option<$crate::event::FieldValue<'a>>,
            ) -> Option<EventData> {
                Some(match event_type {
                    $(
                        $(EventType::$event)|+ => EventData::$name {
                            $( $field: $crate::event::fields::field!(
                                parse get, $crate::event::fields::field!(key $field $($key)?),
                                $kind $(($($param)*))?
                            ), )*
                        },
                    )*
                })
            }
        }

        /// A payload of `event_type` whose every field is set to a value unlike zero and
        /// unlike the other fields' (`seed` varies them): its slots, and the decoded
        /// payload they must give with `string` and `host_ns` (round-trip tests).
        #[doc(hidden)]
        pub fn sample(
            event_type: EventType,
            seed: u64,
            string: &mut dyn FnMut($crate::event::StringId) -> String,
            host_ns: &dyn Fn(u64) -> u64,
        ) -> ($crate::event::Slots, EventData) {
            use $crate::event::Payload;
            match event_type {
                $(
                    $(EventType::$event)|+ => {
                        let mut field = 0u64;
                        let _ = &mut field;
                        let emitted = payload::$name {
                            $( $field: {
                                field += 1;
                                $crate::event::fields::field!(sample seed * 16 + field, $kind $(($($param)*))?)
                            }, )*
                        };
                        let decoded = EventData::$name {
                            $( $field: $crate::event::fields::field!(
                                expect emitted.$field, string, host_ns, $kind $(($($param)*))?
                            ), )*
                        };
                        (emitted.slots(), decoded)
                    }
                )*
            }
        }
    };
}

pub(crate) use {field, system_payloads};
