//! A Parquet table written in batches: typed column builders from a column list, and
//! string columns whose values the caller interns (a dictionary per column).

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::JoinHandle;

use arrow_array::builder::StringBuilder;
use arrow_array::types::{ArrowPrimitiveType, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{ArrayRef, BooleanArray, DictionaryArray, Int32Array, PrimitiveArray, RecordBatch, StringArray};
use arrow_buffer::{ArrowNativeType, NullBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::NtffError;

/// Buffers a column keeps for its next batches.
const MAX_SPARE_BUFFERS: usize = 4;

/// Rows per record batch.
pub(super) const BATCH_ROWS: usize = 64 * 1024;
/// A batch ends sooner when its text columns reach this many bytes (arrow's string
/// offsets are 32-bit; a file's arguments can be long).
const BATCH_TEXT_BYTES: usize = 256 << 20;
/// The longest text value a row holds: a batch with less room left for text is
/// written before more rows are appended.
pub(super) const MAX_TEXT_VALUE: usize = 16 << 20;

/// A column's type: what the caller gives, and how it is written. Every engine that
/// reads Parquet reads these types without options (Spark rejects unsigned 64-bit
/// integers and nanosecond timestamps, and widens unsigned 32-bit ones), so unsigned
/// values are written as signed 64-bit integers and times as microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// The same string in every row of a file (`host`, `session`).
    Constant,
    /// A string from a small set, interned by the caller ([`Table::key`]).
    Dict,
    /// A string of its own per row.
    Text,
    /// A `u32`, written as `INT64` (every value fits).
    U32,
    /// A `u64`, written as `INT64`: values above `i64::MAX` read as negative (their bits
    /// are kept; no id, count or size the runtime records comes near).
    U64,
    I32,
    F64,
    Bool,
    /// Wall-clock nanoseconds, UTC: written as a `TIMESTAMP(MICROS)` column (rounded
    /// down) and, exact, as an `INT64` column of the same name with `_ns` appended.
    Time,
    /// Wall-clock nanoseconds, UTC, where microseconds are enough: a `TIMESTAMP(MICROS)`
    /// column only.
    TimeUs,
}

/// A column: its name, type, and whether it may be null.
pub(super) type Column = (&'static str, Kind, bool);

pub(super) enum Builder {
    Constant,
    Dict(Col<i32>),
    Text(StringBuilder),
    /// `U32` and `U64` columns, as written.
    I64(Col<i64>),
    I32(Col<i32>),
    F64(Col<f64>),
    Bool(Col<bool>),
    /// `Time` and `TimeUs` columns, in nanoseconds.
    Time(Col<i64>),
}

/// A column's values in a batch, and which are null once one is.
pub(super) struct Col<T> {
    values: Vec<T>,
    valid: Option<Vec<bool>>,
    /// Buffers of written batches, back from the writer for the next batches.
    spare: Vec<Vec<T>>,
}

impl<T: Copy + Default> Col<T> {
    fn new() -> Col<T> {
        Col { values: Vec::with_capacity(BATCH_ROWS), valid: None, spare: Vec::new() }
    }

    /// Appends values none of which is null.
    pub(super) fn extend(&mut self, values: impl Iterator<Item = T>) {
        self.values.extend(values);
        if let Some(valid) = &mut self.valid {
            valid.resize(self.values.len(), true);
        }
    }

    /// Appends values some of which may be null.
    pub(super) fn extend_options(&mut self, values: impl Iterator<Item = Option<T>>) {
        for value in values {
            self.push(value);
        }
    }

    pub(super) fn push(&mut self, value: Option<T>) {
        match (value, &mut self.valid) {
            (Some(v), None) => self.values.push(v),
            (Some(v), Some(valid)) => {
                self.values.push(v);
                valid.push(true);
            }
            (None, valid) => {
                let valid = valid.get_or_insert_with(|| {
                    let mut all = Vec::with_capacity(BATCH_ROWS);
                    all.resize(self.values.len(), true);
                    all
                });
                valid.push(false);
                self.values.push(T::default());
            }
        }
    }

    /// The batch's values and nulls, leaving room for the next batch.
    fn take(&mut self) -> (Vec<T>, Option<NullBuffer>) {
        let next = self.spare.pop().unwrap_or_else(|| Vec::with_capacity(BATCH_ROWS));
        let values = std::mem::replace(&mut self.values, next);
        (values, self.valid.take().map(NullBuffer::from))
    }
}

impl<T: ArrowNativeType> Col<T> {
    /// Keeps the values buffer of `array`, a written batch's column, for a next batch
    /// (when nothing else holds it).
    fn reclaim(&mut self, array: ArrayRef) {
        if self.spare.len() < MAX_SPARE_BUFFERS
            && let Some(values) = values_buffer(array)
        {
            self.spare.push(values);
        }
    }

    fn array<A: ArrowPrimitiveType<Native = T>>(&mut self) -> PrimitiveArray<A> {
        let (values, nulls) = self.take();
        PrimitiveArray::new(ScalarBuffer::from(values), nulls)
    }
}

/// The values buffer of `array`, emptied, when nothing else holds it.
fn values_buffer<T: ArrowNativeType>(array: ArrayRef) -> Option<Vec<T>> {
    let data = array.to_data();
    drop(array);
    let buffer = data.buffers().first().cloned()?;
    drop(data);
    let mut values = buffer.into_vec::<T>().ok()?;
    values.clear();
    Some(values)
}

/// A type a column's values are given in, and the type they are kept in (`Dict`
/// columns keep `i32` keys; unsigned integers are kept as they are written, `i64`).
pub(super) trait Value: Copy + Default + Sized {
    type Kept: Copy + Default;
    fn kept(self) -> Self::Kept;
    fn col(builder: &mut Builder) -> Option<&mut Col<Self::Kept>>;
}

macro_rules! value {
    ($t:ty => $kept:ty, $convert:expr, $($variant:ident)|+) => {
        impl Value for $t {
            type Kept = $kept;
            fn kept(self) -> $kept {
                $convert(self)
            }
            fn col(builder: &mut Builder) -> Option<&mut Col<$kept>> {
                match builder {
                    $(Builder::$variant(c))|+ => Some(c),
                    _ => None,
                }
            }
        }
    };
}
value!(u32 => i64, i64::from, I64);
// The bits as they are: values above i64::MAX read as negative (see `Kind::U64`).
value!(u64 => i64, |v: u64| v as i64, I64);
value!(i32 => i32, |v| v, I32 | Dict);
value!(f64 => f64, |v| v, F64);
value!(bool => bool, |v| v, Bool);
value!(i64 => i64, |v| v, Time);

/// A column's values in the batch being built, given as `T`.
pub(super) struct Values<'a, T: Value> {
    col: &'a mut Col<T::Kept>,
}

impl<T: Value> Values<'_, T> {
    /// Appends values none of which is null.
    pub(super) fn extend(&mut self, values: impl Iterator<Item = T>) {
        self.col.extend(values.map(T::kept));
    }

    /// Appends values some of which may be null.
    pub(super) fn extend_options(&mut self, values: impl Iterator<Item = Option<T>>) {
        self.col.extend_options(values.map(|v| v.map(T::kept)));
    }
}

/// Interned values of a `Dict` column.
#[derive(Default)]
struct Interned {
    strings: Vec<String>,
    keys: HashMap<String, i32>,
}

/// One Parquet file being written.
pub(super) struct Table {
    schema: SchemaRef,
    /// The columns as the caller names them (a `Time` column is two in the schema).
    columns: Vec<Column>,
    /// Whether the `Constant` columns are written (else their values are in the
    /// directory names, a hive-partitioned layout's).
    write_constants: bool,
    builders: Vec<Builder>,
    values: Vec<Interned>,
    constants: Vec<Arc<StringArray>>,
    /// Keys of the `Constant` columns: all the first (and only) value, shared by the
    /// batches.
    zero_keys: Int32Array,
    rows_in_batch: usize,
    /// Bytes of the batch's text columns, whose offsets must stay below 2 GiB.
    text_bytes: usize,
    rows: u64,
    batches: Option<SyncSender<RecordBatch>>,
    /// Batches the writer has written, whose buffers the next batches reuse: the
    /// memory of a table is then allocated (and zeroed by the kernel) once.
    written: Receiver<Vec<Option<ArrayRef>>>,
    writer: Option<JoinHandle<Result<(), parquet::errors::ParquetError>>>,
}

/// The schema's fields of a column: one, or two for a `Time` column (none for a
/// `Constant` column not written).
fn fields(&(name, kind, nullable): &Column, write_constants: bool) -> Vec<Field> {
    if kind == Kind::Constant && !write_constants {
        return Vec::new();
    }
    let data_type = match kind {
        Kind::Constant | Kind::Dict => DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
        Kind::Text => DataType::Utf8,
        Kind::U32 | Kind::U64 => DataType::Int64,
        Kind::I32 => DataType::Int32,
        Kind::F64 => DataType::Float64,
        Kind::Bool => DataType::Boolean,
        Kind::Time | Kind::TimeUs => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
    };
    let mut fields = vec![Field::new(name, data_type, nullable)];
    if kind == Kind::Time {
        fields.push(Field::new(format!("{name}_ns"), DataType::Int64, nullable));
    }
    fields
}

fn builder(kind: Kind) -> Builder {
    match kind {
        Kind::Constant => Builder::Constant,
        Kind::Dict => Builder::Dict(Col::new()),
        Kind::Text => Builder::Text(StringBuilder::new()),
        Kind::U32 | Kind::U64 => Builder::I64(Col::new()),
        Kind::I32 => Builder::I32(Col::new()),
        Kind::F64 => Builder::F64(Col::new()),
        Kind::Bool => Builder::Bool(Col::new()),
        Kind::Time | Kind::TimeUs => Builder::Time(Col::new()),
    }
}

impl Table {
    /// Creates `path` for rows of `columns`; `constants` are the values of the
    /// `Constant` columns, in order (`None`: those columns are not written; rows still
    /// set them).
    pub(super) fn create(path: &Path, columns: &[Column], constants: Option<&[&str]>) -> Result<Table, NtffError> {
        let write_constants = constants.is_some();
        let fields = |column: &Column| fields(column, write_constants);
        let schema = Arc::new(Schema::new(columns.iter().flat_map(fields).collect::<Vec<Field>>()));
        // Strings are written plain: zstd takes their repeats for less than building
        // dictionary pages costs. Integers and times are delta-encoded (ids and times
        // grow, small codes repeat), cheaper to write than a dictionary and as small
        // once compressed. Numbers and times get statistics per column chunk, for
        // readers to skip row groups by; strings none (a comparison per value).
        let mut properties = WriterProperties::builder()
            .set_compression(Compression::ZSTD(parquet::basic::ZstdLevel::default()))
            .set_dictionary_enabled(false)
            .set_statistics_enabled(EnabledStatistics::Chunk)
            // Pages end at the page size (1 MiB), not after 20,000 rows: a delta-encoded
            // page of 20,000 rows is a few kilobytes, and each page compresses on its
            // own (a new zstd context each), so small pages cost time and compress
            // to twice the size.
            .set_data_page_row_count_limit(usize::MAX)
            .set_write_batch_size(8 * 1024)
            .set_created_by(format!("neuron-profile {}", env!("CARGO_PKG_VERSION")));
        for column in columns {
            for field in fields(column) {
                let path = ColumnPath::from(field.name().as_str());
                properties = match column.1 {
                    Kind::Time | Kind::TimeUs | Kind::U32 | Kind::U64 | Kind::I32 => {
                        properties.set_column_encoding(path, Encoding::DELTA_BINARY_PACKED)
                    }
                    Kind::Constant | Kind::Dict | Kind::Text => {
                        properties.set_column_statistics_enabled(path, EnabledStatistics::None)
                    }
                    Kind::F64 | Kind::Bool => properties,
                };
            }
        }
        let file = File::create(path).map_err(|e| NtffError::io(path, e))?;
        let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(properties.build())).map_err(parquet_error)?;
        // Batches are encoded and compressed on a thread of their own per table, while
        // the caller reads on.
        let (batches, received) = std::sync::mpsc::sync_channel::<RecordBatch>(2);
        let (give_back, written) = std::sync::mpsc::channel::<Vec<Option<ArrayRef>>>();
        let writer = std::thread::Builder::new()
            .name("parquet-table".into())
            .spawn(move || -> Result<(), parquet::errors::ParquetError> {
                for batch in received {
                    writer.write(&batch)?;
                    // Only the columns whose buffers the table reuses go back (the rest is
                    // freed here); the table may be gone (an error elsewhere): then
                    // nobody reuses them.
                    let reusable = batch
                        .columns()
                        .iter()
                        .map(|a| (!matches!(a.data_type(), DataType::Utf8 | DataType::Boolean)).then(|| a.clone()))
                        .collect();
                    drop(batch);
                    let _ = give_back.send(reusable);
                }
                writer.close().map(|_| ())
            })
            .map_err(|e| NtffError::Write(std::io::Error::other(e)))?;
        let kinds: Vec<Kind> = columns.iter().map(|c| c.1).collect();
        let mut constant_values = constants.unwrap_or_default().iter();
        let constants = kinds
            .iter()
            .filter(|&&k| k == Kind::Constant)
            .map(|_| Arc::new(StringArray::from(vec![*constant_values.next().unwrap_or(&"")])))
            .collect();
        Ok(Table {
            schema,
            columns: columns.to_vec(),
            write_constants,
            builders: kinds.iter().map(|&k| builder(k)).collect(),
            values: kinds.iter().map(|_| Interned::default()).collect(),
            constants,
            rows_in_batch: 0,
            text_bytes: 0,
            rows: 0,
            batches: Some(batches),
            written,
            zero_keys: Int32Array::from(vec![0; BATCH_ROWS]),
            writer: Some(writer),
        })
    }

    /// The key of `value` in the dictionary of column `column`.
    pub(super) fn key(&mut self, column: usize, value: &str) -> i32 {
        let values = &mut self.values[column];
        if let Some(&key) = values.keys.get(value) {
            return key;
        }
        let key = values.strings.len() as i32;
        values.strings.push(value.to_string());
        values.keys.insert(value.to_string(), key);
        key
    }

    /// The position of the column `name` among the table's columns (as given to
    /// [`Table::create`]).
    pub(super) fn position(&self, name: &str) -> usize {
        self.columns.iter().position(|c| c.0 == name).unwrap_or_else(|| panic!("the table has no column {name}"))
    }

    /// The values of column `column` in the batch being built, for appending a
    /// chunk's rows column by column; [`Table::add_rows`] then counts them. The type
    /// is the column's (a bug otherwise).
    pub(super) fn col<T: Value>(&mut self, column: usize) -> Values<'_, T> {
        let col = T::col(&mut self.builders[column])
            .unwrap_or_else(|| panic!("column {column} is not of type {}", std::any::type_name::<T>()));
        Values { col }
    }

    /// A `Text` column's values in the batch being built (the bytes appended are
    /// then counted by [`Table::add_rows`]).
    pub(super) fn text_col(&mut self, column: usize) -> &mut StringBuilder {
        match &mut self.builders[column] {
            Builder::Text(b) => b,
            _ => panic!("column {column} is not a text column"),
        }
    }

    /// Writes the batch if `rows` more (at most [`BATCH_ROWS`]) would not fit in it,
    /// or if it has less room than [`MAX_TEXT_VALUE`] left for text, before rows are
    /// appended column by column.
    pub(super) fn make_room(&mut self, rows: usize) -> Result<(), NtffError> {
        let full = self.rows_in_batch + rows > BATCH_ROWS || self.text_room() < MAX_TEXT_VALUE;
        if self.rows_in_batch > 0 && full { self.flush() } else { Ok(()) }
    }

    /// Bytes of text the batch can take before it is full.
    pub(super) fn text_room(&self) -> usize {
        BATCH_TEXT_BYTES.saturating_sub(self.text_bytes)
    }

    /// Counts `rows` rows appended column by column (and `text_bytes` of their text),
    /// and writes the batch once it is full.
    pub(super) fn add_rows(&mut self, rows: usize, text_bytes: usize) -> Result<(), NtffError> {
        self.rows_in_batch += rows;
        self.rows += rows as u64;
        self.text_bytes += text_bytes;
        if self.rows_in_batch >= BATCH_ROWS || self.text_bytes >= BATCH_TEXT_BYTES { self.flush() } else { Ok(()) }
    }

    /// Appends one row; `row` sets each column through the [`Row`] in order.
    pub(super) fn row(&mut self, fill: impl FnOnce(&mut Row<'_>)) -> Result<(), NtffError> {
        let mut row = Row { builders: &mut self.builders, at: 0, text_bytes: &mut self.text_bytes };
        fill(&mut row);
        debug_assert_eq!(row.at, self.builders.len(), "a row sets every column");
        self.rows_in_batch += 1;
        self.rows += 1;
        if self.rows_in_batch >= BATCH_ROWS || self.text_bytes >= BATCH_TEXT_BYTES { self.flush() } else { Ok(()) }
    }

    fn flush(&mut self) -> Result<(), NtffError> {
        if self.rows_in_batch == 0 {
            return Ok(());
        }
        while let Ok(batch) = self.written.try_recv() {
            self.reclaim(batch);
        }
        let rows = self.rows_in_batch;
        let mut constants = self.constants.iter();
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.builders.len());
        for (k, b) in self.builders.iter_mut().enumerate() {
            let array: ArrayRef = match b {
                Builder::Constant if !self.write_constants => continue,
                Builder::Constant => {
                    let values = constants.next().cloned().unwrap_or_else(|| Arc::new(StringArray::from(vec![""])));
                    if self.zero_keys.len() < rows {
                        self.zero_keys = Int32Array::from(vec![0; rows]);
                    }
                    Arc::new(dictionary(self.zero_keys.slice(0, rows), values)?)
                }
                Builder::Dict(keys) => {
                    let values = Arc::new(StringArray::from_iter_values(self.values[k].strings.iter()));
                    Arc::new(dictionary(keys.array::<Int32Type>(), values)?)
                }
                Builder::Text(b) => Arc::new(b.finish()),
                Builder::I64(b) => Arc::new(b.array::<Int64Type>()),
                Builder::I32(b) => Arc::new(b.array::<Int32Type>()),
                Builder::F64(b) => Arc::new(b.array::<Float64Type>()),
                Builder::Bool(b) => {
                    let (values, nulls) = b.take();
                    Arc::new(BooleanArray::new(values.into(), nulls))
                }
                Builder::Time(b) => {
                    let nanoseconds = b.array::<Int64Type>();
                    // Microseconds rounded down, so that a time never reads later than
                    // it was.
                    let micros: PrimitiveArray<TimestampMicrosecondType> = nanoseconds.unary(|ns| ns.div_euclid(1_000));
                    arrays.push(Arc::new(micros.with_timezone("UTC")));
                    if self.columns[k].1 == Kind::TimeUs {
                        continue;
                    }
                    Arc::new(nanoseconds)
                }
            };
            arrays.push(array);
        }
        let batch = RecordBatch::try_new(self.schema.clone(), arrays).map_err(|e| invalid(e.to_string()))?;
        let sent = self.batches.as_ref().is_some_and(|b| b.send(batch).is_ok());
        if !sent {
            // The writer stopped on an error: `finish` reports it.
            return self.close();
        }
        self.rows_in_batch = 0;
        self.text_bytes = 0;
        Ok(())
    }

    /// Keeps the buffers of a written batch's columns for the next batches.
    /// (A `Time` column's values buffer is its `_ns` column's; its microseconds are
    /// computed into a new one.)
    fn reclaim(&mut self, columns: Vec<Option<ArrayRef>>) {
        let mut columns = columns.into_iter();
        for (builder, column) in self.builders.iter_mut().zip(&self.columns) {
            let array = match column.1 {
                Kind::Constant if !self.write_constants => continue,
                // Its microseconds are computed into a new buffer for each batch.
                Kind::Time => columns.nth(1),
                _ => columns.next(),
            };
            let Some(Some(array)) = array else { continue };
            match builder {
                Builder::Dict(c) | Builder::I32(c) => c.reclaim(array),
                Builder::I64(c) | Builder::Time(c) => c.reclaim(array),
                Builder::F64(c) => c.reclaim(array),
                Builder::Constant | Builder::Text(_) | Builder::Bool(_) => {}
            }
        }
    }

    /// Writes the last rows and the footer; returns the rows written.
    pub(super) fn finish(mut self) -> Result<u64, NtffError> {
        self.flush()?;
        self.close()?;
        Ok(self.rows)
    }

    /// Ends the writer thread and returns what it met.
    fn close(&mut self) -> Result<(), NtffError> {
        self.batches = None;
        match self.writer.take().map(JoinHandle::join) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(parquet_error(e)),
            Some(Err(_)) => Err(invalid("the Parquet writer thread panicked".into())),
        }
    }
}

impl Drop for Table {
    /// A table left unfinished (an error elsewhere) stops its writer before the caller
    /// goes on: its file is left without a footer, which readers refuse.
    fn drop(&mut self) {
        let _ = self.close();
    }
}

fn dictionary(keys: Int32Array, values: Arc<StringArray>) -> Result<DictionaryArray<Int32Type>, NtffError> {
    DictionaryArray::try_new(keys, values).map_err(|e| invalid(e.to_string()))
}

fn parquet_error(e: parquet::errors::ParquetError) -> NtffError {
    match e {
        parquet::errors::ParquetError::External(e) => NtffError::Write(std::io::Error::other(e)),
        e => NtffError::Write(std::io::Error::other(e)),
    }
}

fn invalid(reason: String) -> NtffError {
    NtffError::Write(std::io::Error::other(reason))
}

/// A row set a column with a value of another type: a bug in the table's writer.
fn mismatch(column: usize) {
    debug_assert!(false, "column {} was set with a value of another type", column.saturating_sub(1));
}

/// The columns of one row, set in order.
pub(super) struct Row<'a> {
    builders: &'a mut [Builder],
    at: usize,
    text_bytes: &'a mut usize,
}

impl Row<'_> {
    fn next(&mut self) -> &mut Builder {
        let b = &mut self.builders[self.at];
        self.at += 1;
        b
    }

    /// A `Constant` column.
    pub(super) fn constant(&mut self) -> &mut Self {
        self.next();
        self
    }

    /// A `Dict` column, by its key (`None`: null).
    pub(super) fn key(&mut self, key: Option<i32>) -> &mut Self {
        if let Builder::Dict(b) = self.next() {
            b.push(key);
        } else {
            mismatch(self.at);
        }
        self
    }

    pub(super) fn text(&mut self, value: Option<&str>) -> &mut Self {
        *self.text_bytes += value.map_or(0, str::len);
        if let Builder::Text(b) = self.next() {
            b.append_option(value);
        } else {
            mismatch(self.at);
        }
        self
    }

    pub(super) fn u32(&mut self, value: Option<u32>) -> &mut Self {
        self.set(value)
    }

    pub(super) fn u64(&mut self, value: Option<u64>) -> &mut Self {
        self.set(value)
    }

    pub(super) fn i32(&mut self, value: Option<i32>) -> &mut Self {
        if let Builder::I32(b) = self.next() {
            b.push(value);
        } else {
            mismatch(self.at);
        }
        self
    }

    pub(super) fn f64(&mut self, value: Option<f64>) -> &mut Self {
        self.set(value)
    }

    pub(super) fn bool(&mut self, value: bool) -> &mut Self {
        if let Builder::Bool(b) = self.next() {
            b.push(Some(value));
        } else {
            mismatch(self.at);
        }
        self
    }

    /// A `Time` column, in wall-clock nanoseconds.
    pub(super) fn time(&mut self, value: Option<i64>) -> &mut Self {
        self.set(value)
    }

    /// The next column, of the type `T` is kept in.
    fn set<T: Value>(&mut self, value: Option<T>) -> &mut Self {
        match T::col(self.next()) {
            Some(b) => b.push(value.map(T::kept)),
            None => mismatch(self.at),
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spare(t: &mut Table) -> usize {
        match &t.builders[0] {
            Builder::I64(c) => c.spare.len(),
            _ => unreachable!("a u64 column"),
        }
    }

    /// The batches of the Parquet file at `path`.
    fn read(path: &Path) -> Vec<RecordBatch> {
        let file = File::open(path).expect("written");
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("Parquet")
            .build()
            .expect("reader");
        reader.map(|b| b.expect("batch")).collect()
    }

    #[test]
    fn columns_are_written_in_types_every_engine_reads() {
        use arrow_array::cast::AsArray;
        let dir = tempfile::tempdir().expect("tempdir");
        let columns = [
            ("host", Kind::Constant, false),
            ("count", Kind::U32, false),
            ("id", Kind::U64, true),
            ("time", Kind::Time, true),
            ("at", Kind::TimeUs, true),
        ];
        let times = [Some(1_700_000_000_123_456_789), Some(-1), None, Some(999)];
        for (name, constants) in [("with.parquet", Some(&["h"][..])), ("without.parquet", None)] {
            let path = dir.path().join(name);
            let mut t = Table::create(&path, &columns, constants).expect("table");
            for (k, time) in times.into_iter().enumerate() {
                t.row(|r| {
                    r.constant()
                        .u32(Some(u32::MAX - k as u32))
                        .u64((k != 1).then_some(u64::MAX - k as u64))
                        .time(time)
                        .time(time);
                })
                .expect("row");
            }
            assert_eq!(t.finish().expect("finished"), 4);
            let batch = &read(&path)[0];
            let names: Vec<String> = batch.schema().fields().iter().map(|f| f.name().clone()).collect();
            let mut expected = vec!["count", "id", "time", "time_ns", "at"];
            if constants.is_some() {
                expected.insert(0, "host");
            }
            assert_eq!(names, expected, "{name}");
            let column = |name: &str| batch.column_by_name(name).expect("the column");
            let utc_micros = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
            assert_eq!(column("time").data_type(), &utc_micros);
            assert_eq!(column("at").data_type(), &utc_micros);
            for name in ["count", "id", "time_ns"] {
                assert_eq!(column(name).data_type(), &DataType::Int64, "{name}");
            }
            let count: Vec<i64> = column("count").as_primitive::<Int64Type>().values().to_vec();
            assert_eq!(count, [4_294_967_295, 4_294_967_294, 4_294_967_293, 4_294_967_292], "every u32 as it is");
            let id: Vec<Option<i64>> = column("id").as_primitive::<Int64Type>().iter().collect();
            assert_eq!(id, [Some(-1), None, Some(-3), Some(-4)], "a u64's bits");
            let micros: Vec<Option<i64>> = column("time").as_primitive::<TimestampMicrosecondType>().iter().collect();
            assert_eq!(micros, [Some(1_700_000_000_123_456), Some(-1), None, Some(0)], "rounded down");
            let at: Vec<Option<i64>> = column("at").as_primitive::<TimestampMicrosecondType>().iter().collect();
            assert_eq!(at, micros);
            let ns: Vec<Option<i64>> = column("time_ns").as_primitive::<Int64Type>().iter().collect();
            assert_eq!(ns, times, "exact");
        }
    }

    #[test]
    fn a_written_batch_gives_its_buffers_to_a_later_one_without_its_values_or_nulls() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.parquet");
        let mut t = Table::create(&path, &[("v", Kind::U64, true)], Some(&[])).expect("table");
        // A full batch with nulls: written as soon as it is counted.
        let first: Vec<Option<u64>> = (0..BATCH_ROWS as u64).map(|v| (v % 3 != 0).then_some(v)).collect();
        t.col::<u64>(0).extend_options(first.iter().copied());
        t.add_rows(BATCH_ROWS, 0).expect("first batch");
        let given_back = t.written.recv().expect("the writer gives the batch back");
        t.reclaim(given_back);
        assert_eq!(spare(&mut t), 1, "its values buffer is kept");
        // The next batch is written, and the one after it starts in the kept buffer.
        t.col::<u64>(0).extend(1_000..1_010);
        t.add_rows(10, 0).expect("second batch");
        t.flush().expect("written");
        assert_eq!(spare(&mut t), 0, "the kept buffer is in use");
        t.col::<u64>(0).extend(2_000..2_005);
        t.add_rows(5, 0).expect("third batch");
        assert_eq!(t.finish().expect("finished"), BATCH_ROWS as u64 + 15);

        let file = File::open(&path).expect("written");
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("Parquet")
            .build()
            .expect("reader");
        let mut read = Vec::new();
        for batch in reader {
            let batch = batch.expect("batch");
            let values = batch.column(0).as_any().downcast_ref::<arrow_array::Int64Array>().expect("i64");
            read.extend(values.iter().map(|v| v.map(|v| v as u64)));
        }
        let expected: Vec<Option<u64>> =
            first.into_iter().chain((1_000..1_010).map(Some)).chain((2_000..2_005).map(Some)).collect();
        assert_eq!(read, expected);
    }
}
