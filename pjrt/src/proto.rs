//! The parts of XLA's protocol buffers a framework hands a PJRT plugin that this plugin
//! reads: `HloModuleProto` (the program, `xla/service/hlo.proto`, with `ShapeProto`,
//! `LiteralProto` and the dimension numbers of `xla/xla_data.proto`) and
//! `CompileOptionsProto` (`xla/pjrt/compile_options.proto`), declared with the field
//! numbers of those files. Fields not declared here are skipped when decoding; the
//! original bytes are kept where a framework wants the module back
//! ([`module_with_config`]).

use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub(crate) struct HloModuleProto {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(string, tag = "2")]
    pub(crate) entry_computation_name: String,
    #[prost(message, repeated, tag = "3")]
    pub(crate) computations: Vec<HloComputationProto>,
    #[prost(message, optional, tag = "4")]
    pub(crate) host_program_shape: Option<ProgramShapeProto>,
    #[prost(int64, tag = "5")]
    pub(crate) id: i64,
    #[prost(int64, tag = "6")]
    pub(crate) entry_computation_id: i64,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct HloComputationProto {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(message, repeated, tag = "2")]
    pub(crate) instructions: Vec<HloInstructionProto>,
    #[prost(message, optional, tag = "4")]
    pub(crate) program_shape: Option<ProgramShapeProto>,
    #[prost(int64, tag = "5")]
    pub(crate) id: i64,
    #[prost(int64, tag = "6")]
    pub(crate) root_id: i64,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct HloInstructionProto {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(string, tag = "2")]
    pub(crate) opcode: String,
    #[prost(message, optional, tag = "3")]
    pub(crate) shape: Option<ShapeProto>,
    #[prost(message, optional, tag = "7")]
    pub(crate) metadata: Option<OpMetadata>,
    #[prost(message, optional, tag = "8")]
    pub(crate) literal: Option<LiteralProto>,
    #[prost(int64, tag = "9")]
    pub(crate) parameter_number: i64,
    #[prost(int64, tag = "13")]
    pub(crate) tuple_index: i64,
    #[prost(int64, repeated, tag = "14")]
    pub(crate) dimensions: Vec<i64>,
    #[prost(message, optional, tag = "15")]
    pub(crate) window: Option<Window>,
    #[prost(message, optional, tag = "16")]
    pub(crate) convolution_dimension_numbers: Option<ConvolutionDimensionNumbers>,
    #[prost(message, repeated, tag = "17")]
    pub(crate) slice_dimensions: Vec<SliceDimensions>,
    #[prost(int32, tag = "18")]
    pub(crate) exponent_bits: i32,
    #[prost(int32, tag = "19")]
    pub(crate) mantissa_bits: i32,
    #[prost(int64, repeated, tag = "20")]
    pub(crate) dynamic_slice_sizes: Vec<i64>,
    #[prost(message, optional, tag = "21")]
    pub(crate) padding_config: Option<PaddingConfig>,
    #[prost(int32, tag = "23")]
    pub(crate) distribution: i32,
    #[prost(float, tag = "24")]
    pub(crate) epsilon: f32,
    #[prost(int64, tag = "25")]
    pub(crate) feature_index: i64,
    #[prost(int64, tag = "26")]
    pub(crate) channel_id: i64,
    #[prost(string, tag = "28")]
    pub(crate) custom_call_target: String,
    #[prost(message, optional, tag = "30")]
    pub(crate) dot_dimension_numbers: Option<DotDimensionNumbers>,
    #[prost(message, optional, tag = "33")]
    pub(crate) gather_dimension_numbers: Option<GatherDimensionNumbers>,
    #[prost(int64, repeated, tag = "34")]
    pub(crate) gather_slice_sizes: Vec<i64>,
    #[prost(int64, tag = "35")]
    pub(crate) id: i64,
    #[prost(int64, repeated, tag = "36")]
    pub(crate) operand_ids: Vec<i64>,
    #[prost(int64, repeated, tag = "38")]
    pub(crate) called_computation_ids: Vec<i64>,
    #[prost(bytes = "vec", tag = "43")]
    pub(crate) backend_config: Vec<u8>,
    #[prost(message, repeated, tag = "49")]
    pub(crate) replica_groups: Vec<ReplicaGroup>,
    #[prost(message, optional, tag = "48")]
    pub(crate) scatter_dimension_numbers: Option<ScatterDimensionNumbers>,
    #[prost(int64, tag = "50")]
    pub(crate) feature_group_count: i64,
    #[prost(message, repeated, tag = "52")]
    pub(crate) source_target_pairs: Vec<SourceTarget>,
    #[prost(int64, tag = "58")]
    pub(crate) batch_group_count: i64,
    #[prost(bool, tag = "60")]
    pub(crate) is_stable: bool,
    #[prost(string, tag = "63")]
    pub(crate) comparison_direction: String,
    #[prost(bool, tag = "67")]
    pub(crate) indices_are_sorted: bool,
    #[prost(message, optional, tag = "68")]
    pub(crate) frontend_attributes: Option<FrontendAttributes>,
    #[prost(bool, tag = "69")]
    pub(crate) unique_indices: bool,
    #[prost(int32, tag = "70")]
    pub(crate) rng_algorithm: i32,
    #[prost(bool, tag = "71")]
    pub(crate) use_global_device_ids: bool,
    #[prost(string, tag = "72")]
    pub(crate) comparison_type: String,
    #[prost(int64, tag = "81")]
    pub(crate) k: i64,
    #[prost(bool, tag = "85")]
    pub(crate) largest: bool,
    #[prost(message, optional, tag = "87")]
    pub(crate) collective_device_list: Option<CollectiveDeviceListProto>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct ShapeProto {
    #[prost(int32, tag = "2")]
    pub(crate) element_type: i32,
    #[prost(int64, repeated, tag = "3")]
    pub(crate) dimensions: Vec<i64>,
    #[prost(message, repeated, tag = "4")]
    pub(crate) tuple_shapes: Vec<ShapeProto>,
    #[prost(message, optional, tag = "5")]
    pub(crate) layout: Option<LayoutProto>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct LayoutProto {
    #[prost(int64, repeated, tag = "1")]
    pub(crate) minor_to_major: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct ProgramShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub(crate) parameters: Vec<ShapeProto>,
    #[prost(message, optional, tag = "2")]
    pub(crate) result: Option<ShapeProto>,
    #[prost(string, repeated, tag = "3")]
    pub(crate) parameter_names: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct OpMetadata {
    #[prost(string, tag = "1")]
    pub(crate) op_type: String,
    #[prost(string, tag = "2")]
    pub(crate) op_name: String,
    #[prost(string, tag = "3")]
    pub(crate) source_file: String,
    #[prost(int32, tag = "4")]
    pub(crate) source_line: i32,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct LiteralProto {
    #[prost(message, optional, tag = "1")]
    pub(crate) shape: Option<ShapeProto>,
    #[prost(bool, repeated, tag = "2")]
    pub(crate) preds: Vec<bool>,
    #[prost(bytes = "vec", tag = "3")]
    pub u8s: Vec<u8>,
    #[prost(int32, repeated, tag = "4")]
    pub s32s: Vec<i32>,
    #[prost(int64, repeated, tag = "5")]
    pub s64s: Vec<i64>,
    #[prost(uint32, repeated, tag = "6")]
    pub u32s: Vec<u32>,
    #[prost(uint64, repeated, tag = "7")]
    pub u64s: Vec<u64>,
    #[prost(float, repeated, tag = "8")]
    pub f32s: Vec<f32>,
    #[prost(double, repeated, tag = "9")]
    pub f64s: Vec<f64>,
    #[prost(message, repeated, tag = "10")]
    pub(crate) tuple_literals: Vec<LiteralProto>,
    #[prost(bytes = "vec", tag = "11")]
    pub f16s: Vec<u8>,
    #[prost(bytes = "vec", tag = "13")]
    pub bf16s: Vec<u8>,
    #[prost(bytes = "vec", tag = "15")]
    pub s8s: Vec<u8>,
    #[prost(bytes = "vec", tag = "16")]
    pub u16s: Vec<u8>,
    #[prost(bytes = "vec", tag = "17")]
    pub s16s: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct Window {
    #[prost(message, repeated, tag = "1")]
    pub(crate) dimensions: Vec<WindowDimension>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct WindowDimension {
    #[prost(int64, tag = "1")]
    pub(crate) size: i64,
    #[prost(int64, tag = "2")]
    pub(crate) stride: i64,
    #[prost(int64, tag = "3")]
    pub(crate) padding_low: i64,
    #[prost(int64, tag = "4")]
    pub(crate) padding_high: i64,
    #[prost(int64, tag = "5")]
    pub(crate) window_dilation: i64,
    #[prost(int64, tag = "6")]
    pub(crate) base_dilation: i64,
    #[prost(bool, tag = "7")]
    pub(crate) window_reversal: bool,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct ConvolutionDimensionNumbers {
    #[prost(int64, tag = "7")]
    pub(crate) input_batch_dimension: i64,
    #[prost(int64, tag = "8")]
    pub(crate) input_feature_dimension: i64,
    #[prost(int64, repeated, tag = "11")]
    pub(crate) input_spatial_dimensions: Vec<i64>,
    #[prost(int64, tag = "3")]
    pub(crate) kernel_input_feature_dimension: i64,
    #[prost(int64, tag = "4")]
    pub(crate) kernel_output_feature_dimension: i64,
    #[prost(int64, repeated, tag = "6")]
    pub(crate) kernel_spatial_dimensions: Vec<i64>,
    #[prost(int64, tag = "9")]
    pub(crate) output_batch_dimension: i64,
    #[prost(int64, tag = "10")]
    pub(crate) output_feature_dimension: i64,
    #[prost(int64, repeated, tag = "12")]
    pub(crate) output_spatial_dimensions: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct DotDimensionNumbers {
    #[prost(int64, repeated, tag = "1")]
    pub(crate) lhs_contracting_dimensions: Vec<i64>,
    #[prost(int64, repeated, tag = "2")]
    pub(crate) rhs_contracting_dimensions: Vec<i64>,
    #[prost(int64, repeated, tag = "3")]
    pub(crate) lhs_batch_dimensions: Vec<i64>,
    #[prost(int64, repeated, tag = "4")]
    pub(crate) rhs_batch_dimensions: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct SliceDimensions {
    #[prost(int64, tag = "1")]
    pub(crate) start: i64,
    #[prost(int64, tag = "2")]
    pub(crate) limit: i64,
    #[prost(int64, tag = "3")]
    pub(crate) stride: i64,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct PaddingConfig {
    #[prost(message, repeated, tag = "1")]
    pub(crate) dimensions: Vec<PaddingDimension>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct PaddingDimension {
    #[prost(int64, tag = "1")]
    pub(crate) edge_padding_low: i64,
    #[prost(int64, tag = "2")]
    pub(crate) edge_padding_high: i64,
    #[prost(int64, tag = "3")]
    pub(crate) interior_padding: i64,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct GatherDimensionNumbers {
    #[prost(int64, repeated, tag = "1")]
    pub(crate) offset_dims: Vec<i64>,
    #[prost(int64, repeated, tag = "2")]
    pub(crate) collapsed_slice_dims: Vec<i64>,
    #[prost(int64, repeated, tag = "3")]
    pub(crate) start_index_map: Vec<i64>,
    #[prost(int64, tag = "4")]
    pub(crate) index_vector_dim: i64,
    #[prost(int64, repeated, tag = "5")]
    pub(crate) operand_batching_dims: Vec<i64>,
    #[prost(int64, repeated, tag = "6")]
    pub(crate) start_indices_batching_dims: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct ScatterDimensionNumbers {
    #[prost(int64, repeated, tag = "1")]
    pub(crate) update_window_dims: Vec<i64>,
    #[prost(int64, repeated, tag = "2")]
    pub(crate) inserted_window_dims: Vec<i64>,
    #[prost(int64, repeated, tag = "3")]
    pub(crate) scatter_dims_to_operand_dims: Vec<i64>,
    #[prost(int64, tag = "4")]
    pub(crate) index_vector_dim: i64,
    #[prost(int64, repeated, tag = "5")]
    pub(crate) input_batching_dims: Vec<i64>,
    #[prost(int64, repeated, tag = "6")]
    pub(crate) scatter_indices_batching_dims: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct ReplicaGroup {
    #[prost(int64, repeated, tag = "1")]
    pub(crate) replica_ids: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct SourceTarget {
    #[prost(int64, tag = "1")]
    pub(crate) source: i64,
    #[prost(int64, tag = "2")]
    pub(crate) target: i64,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct CollectiveDeviceListProto {
    #[prost(message, repeated, tag = "1")]
    pub(crate) replica_groups: Vec<ReplicaGroup>,
    #[prost(message, optional, tag = "2")]
    pub(crate) iota_replica_group_list: Option<IotaReplicaGroupList>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct IotaReplicaGroupList {
    #[prost(int64, tag = "1")]
    pub(crate) num_replica_groups: i64,
    #[prost(int64, tag = "2")]
    pub(crate) num_devices_per_group: i64,
    #[prost(int64, repeated, tag = "3")]
    pub(crate) iota_reshape_dims: Vec<i64>,
    #[prost(int32, repeated, tag = "4")]
    pub(crate) iota_transpose_perm: Vec<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct FrontendAttributes {
    #[prost(btree_map = "string, string", tag = "1")]
    pub(crate) map: std::collections::BTreeMap<String, String>,
}

/// `CompileOptionsProto`: what this plugin reads of it is the replica and partition
/// counts of its `ExecutableBuildOptionsProto`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct CompileOptionsProto {
    #[prost(message, optional, tag = "3")]
    pub(crate) executable_build_options: Option<ExecutableBuildOptionsProto>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct ExecutableBuildOptionsProto {
    #[prost(int64, tag = "1")]
    pub(crate) device_ordinal: i64,
    #[prost(int64, tag = "4")]
    pub(crate) num_replicas: i64,
    #[prost(int64, tag = "5")]
    pub(crate) num_partitions: i64,
}

/// `HloModuleConfigProto`: the entry computation's layout and the replica count.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct HloModuleConfigProto {
    #[prost(message, optional, tag = "1")]
    pub(crate) entry_computation_layout: Option<ProgramShapeProto>,
    #[prost(int64, tag = "4")]
    pub(crate) replica_count: i64,
    #[prost(int64, tag = "5")]
    pub(crate) num_partitions: i64,
}

/// `HloModuleProtoWithConfig { hlo_module = 1; config = 2; }` around the module's
/// original bytes (every field kept, declared here or not).
pub(crate) fn module_with_config(module: &[u8], config: &HloModuleConfigProto) -> Vec<u8> {
    use prost::encoding::{WireType, encode_key, encode_varint};
    let config = config.encode_to_vec();
    let mut out = Vec::with_capacity(module.len() + config.len() + 20);
    encode_key(1, WireType::LengthDelimited, &mut out);
    encode_varint(module.len() as u64, &mut out);
    out.extend_from_slice(module);
    encode_key(2, WireType::LengthDelimited, &mut out);
    encode_varint(config.len() as u64, &mut out);
    out.extend_from_slice(&config);
    out
}

/// XLA's `PrimitiveType` numbers.
pub(crate) mod primitive {
    pub(crate) const PRED: i32 = 1;
    pub(crate) const S8: i32 = 2;
    pub(crate) const S16: i32 = 3;
    pub(crate) const S32: i32 = 4;
    pub(crate) const S64: i32 = 5;
    pub(crate) const U8: i32 = 6;
    pub(crate) const U16: i32 = 7;
    pub(crate) const U32: i32 = 8;
    pub(crate) const U64: i32 = 9;
    pub(crate) const F16: i32 = 10;
    pub(crate) const F32: i32 = 11;
    pub(crate) const F64: i32 = 12;
    pub(crate) const TUPLE: i32 = 13;
    pub(crate) const BF16: i32 = 16;
    pub(crate) const TOKEN: i32 = 17;

    /// The HLO text name of a primitive type.
    pub(crate) fn name(element_type: i32) -> Option<&'static str> {
        Some(match element_type {
            PRED => "pred",
            S8 => "s8",
            S16 => "s16",
            S32 => "s32",
            S64 => "s64",
            U8 => "u8",
            U16 => "u16",
            U32 => "u32",
            U64 => "u64",
            F16 => "f16",
            F32 => "f32",
            F64 => "f64",
            BF16 => "bf16",
            TOKEN => "token",
            _ => return None,
        })
    }
}
