//! Collectives across cores: every operation against a reference on 2, 4 and 8 ranks
//! with several replica groupings and both algorithms; HLO collectives in models loaded
//! on several cores, and `partition-id`; a rank that never arrives; events, counters and
//! scheduling.

use std::time::{Duration, Instant};

use neuron_datastore::topology::InstanceType;
use neuron_datastore::{ALL_SYSTEM_EVENTS, EventData, EventType, Phase};
use neuron_datastore::{DatastoreReader, TailStart, TraceEvent};
use neuron_runtime::isa::ReduceOp;
use neuron_runtime::{
    Algorithm, ArrayType, Collective, CollectiveCall, Communicator, CoreSet, DType, Model, Neff, NrtError, NrtStatus,
    Runtime, Target, TensorPlacement, compile_hlo,
};

use neuron_test_support::runtime::{self as common, f32_bytes};

/// A runtime on cores 0-7 of a trn1.32xlarge (two cores per device).
fn started(adjust: impl FnOnce(&mut neuron_runtime::Config)) -> common::Fixture {
    common::started(CoreSet::range(0, 7), |config| {
        config.instance_type = InstanceType::Trn1_32xlarge;
        adjust(config);
    })
}

/// Runs `call` on every rank of `comm` at once, each from its own thread, with rank
/// `r`'s input `inputs[r]` and an output of `output_bytes`; returns each rank's output.
fn run_ranks(
    rt: &Runtime,
    comm: &Communicator,
    call: &CollectiveCall,
    inputs: &[Vec<u8>],
    output_bytes: usize,
) -> Vec<Result<Vec<u8>, NrtError>> {
    std::thread::scope(|scope| {
        let ranks: Vec<_> = inputs
            .iter()
            .enumerate()
            .map(|(rank, input)| {
                scope.spawn(move || {
                    let core = comm.core(rank as u32).expect("rank exists");
                    let placement = TensorPlacement::Device { core };
                    let x = rt.allocate_tensor(placement, input.len() as u64, "x").expect("alloc");
                    x.write(0, input).expect("write");
                    let y = rt.allocate_tensor(placement, output_bytes as u64, "y").expect("alloc");
                    comm.run(rank as u32, call, Some(&x), Some(&y))?;
                    Ok(y.read_all().expect("read"))
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().expect("rank thread")).collect()
    })
}

/// The groups as lists of ranks (no groups: one group of all).
fn expand(groups: &[Vec<u32>], ranks: usize) -> Vec<Vec<usize>> {
    if groups.is_empty() {
        return vec![(0..ranks).collect()];
    }
    groups.iter().map(|g| g.iter().map(|&r| r as usize).collect()).collect()
}

fn fold(op: ReduceOp, values: impl Iterator<Item = f32>) -> f32 {
    values
        .reduce(|a, b| match op {
            ReduceOp::Add => a + b,
            ReduceOp::Multiply => a * b,
            ReduceOp::Maximum => a.max(b),
            ReduceOp::Minimum => a.min(b),
        })
        .expect("a group has members")
}

/// What each rank should get, computed directly from the definitions.
fn reference(op: Collective, groups: &[Vec<usize>], inputs: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let mut outputs = vec![Vec::new(); inputs.len()];
    for group in groups {
        let g = group.len();
        let len = inputs[group[0]].len();
        let reduced =
            |op: ReduceOp| -> Vec<f32> { (0..len).map(|i| fold(op, group.iter().map(|&r| inputs[r][i]))).collect() };
        for (p, &rank) in group.iter().enumerate() {
            outputs[rank] = match op {
                Collective::AllReduce(op) => reduced(op),
                Collective::AllGather => group.iter().flat_map(|&r| inputs[r].clone()).collect(),
                Collective::ReduceScatter(op) => reduced(op)[p * len / g..(p + 1) * len / g].to_vec(),
                Collective::AllToAll => {
                    group.iter().flat_map(|&r| inputs[r][p * len / g..(p + 1) * len / g].to_vec()).collect()
                }
                _ => unreachable!("not a data collective"),
            };
        }
    }
    outputs
}

#[test]
fn every_collective_matches_the_reference_on_2_4_and_8_ranks_with_several_groupings() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let elements = 48;
    let operations = [
        Collective::AllReduce(ReduceOp::Add),
        Collective::AllReduce(ReduceOp::Maximum),
        Collective::AllReduce(ReduceOp::Minimum),
        Collective::AllGather,
        Collective::ReduceScatter(ReduceOp::Add),
        Collective::ReduceScatter(ReduceOp::Maximum),
        Collective::ReduceScatter(ReduceOp::Minimum),
        Collective::AllToAll,
    ];
    let mut checked = 0;
    for ranks in [2usize, 4, 8] {
        let cores: Vec<u32> = (0..ranks as u32).collect();
        let comm = rt.communicator(&cores).expect("communicator");
        let mut groupings: Vec<Vec<Vec<u32>>> = vec![vec![], (0..ranks as u32).map(|r| vec![r]).collect()];
        groupings.push((0..ranks as u32 / 2).map(|i| vec![2 * i, 2 * i + 1]).collect());
        if ranks >= 4 {
            // Interleaved: even ranks together, odd ranks together.
            groupings.push((0..2).map(|k| (0..ranks as u32).filter(|r| r % 2 == k).collect()).collect());
        }
        // Whole numbers keep every order of summation exact, so both algorithms must
        // match the reference bit for bit.
        let inputs: Vec<Vec<f32>> =
            (0..ranks).map(|r| (0..elements).map(|i| ((r * 7 + i * 3) % 11) as f32 - 5.0).collect()).collect();
        let input_bytes: Vec<Vec<u8>> = inputs.iter().map(|v| f32_bytes(v)).collect();
        for groups in &groupings {
            let g = expand(groups, ranks)[0].len();
            for op in operations {
                let expected = reference(op, &expand(groups, ranks), &inputs);
                let output_elements = match op {
                    Collective::AllGather => elements * g,
                    Collective::ReduceScatter(_) => elements / g,
                    _ => elements,
                };
                for algorithm in [None, Some(Algorithm::Ring), Some(Algorithm::AllToAll)] {
                    let mut call = CollectiveCall::new(op, DType::F32).groups(groups.clone());
                    call.algorithm = algorithm;
                    let outputs = run_ranks(rt, &comm, &call, &input_bytes, output_elements * 4);
                    for (rank, output) in outputs.into_iter().enumerate() {
                        let output = output.unwrap_or_else(|e| panic!("{op:?} {groups:?} {algorithm:?}: {e}"));
                        assert_eq!(
                            common::floats(&output),
                            expected[rank],
                            "{op:?} on {ranks} ranks, groups {groups:?}, {algorithm:?}, rank {rank}"
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 3 * 8 * (3 + 4 + 4), "every combination ran");
}

#[test]
fn a_ring_all_reduce_of_uneven_parts_and_inexact_sums_gives_every_rank_the_same_bits() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let comm = rt.communicator(&[0, 1, 2, 3]).expect("communicator");
    // 13 elements split four ways: parts of 3, 3, 3 and 4.
    let inputs: Vec<Vec<f32>> =
        (0..4).map(|r| (0..13).map(|i| 0.1 * (r as f32 + 1.0) + 1e-3 * i as f32).collect()).collect();
    let bytes: Vec<Vec<u8>> = inputs.iter().map(|v| f32_bytes(v)).collect();
    for algorithm in [Algorithm::Ring, Algorithm::AllToAll] {
        let call = CollectiveCall::new(Collective::AllReduce(ReduceOp::Add), DType::F32).algorithm(algorithm);
        let outputs: Vec<Vec<u8>> =
            run_ranks(rt, &comm, &call, &bytes, 13 * 4).into_iter().map(|o| o.expect("runs")).collect();
        assert!(outputs.iter().all(|o| o == &outputs[0]), "{algorithm:?}: every rank holds the same bits");
        let sums = common::floats(&outputs[0]);
        for (i, sum) in sums.iter().enumerate() {
            let exact: f64 = inputs.iter().map(|v| f64::from(v[i])).sum();
            assert!((f64::from(*sum) - exact).abs() < 1e-5, "{algorithm:?} element {i}: {sum} vs {exact}");
        }
    }
    // Integers and a reduction of bf16 through the same paths.
    let ints: Vec<Vec<u8>> = (0..4).map(|r| (0..8).flat_map(|i: i32| (i * 1000 - r).to_le_bytes()).collect()).collect();
    let call = CollectiveCall::new(Collective::AllReduce(ReduceOp::Add), DType::S32).algorithm(Algorithm::Ring);
    for output in run_ranks(rt, &comm, &call, &ints, 32) {
        assert_eq!(common::ints(&output.expect("runs")), (0..8).map(|i| i * 4000 - 6).collect::<Vec<_>>());
    }
}

#[test]
fn an_output_written_in_place_a_sliced_one_and_one_that_is_the_input_all_get_the_result() {
    let fx = started(|_| {});
    let comm = fx.runtime.communicator(&[0, 1, 2]).expect("communicator");
    let elements = 1 << 16;
    let call = CollectiveCall::new(Collective::AllReduce(ReduceOp::Add), DType::F32);
    let bytes = (elements * 4) as u64;
    let outputs = std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..3u32)
            .map(|rank| {
                let (rt, comm, call) = (&fx.runtime, &comm, &call);
                scope.spawn(move || {
                    let placement = TensorPlacement::Device { core: rank };
                    let x = rt.allocate_tensor(placement, bytes, "x")?;
                    x.write(0, &f32_bytes(&vec![rank as f32 + 1.0; elements]))?;
                    // Rank 0 sums in place; rank 1 into a slice of a larger tensor (its
                    // memory shared with the slice); rank 2 into a tensor of its own.
                    let (holder, y) = match rank {
                        0 => (None, x.clone()),
                        1 => {
                            let whole = rt.allocate_tensor(placement, 2 * bytes, "whole")?;
                            let y = whole.slice(bytes, bytes, "y")?;
                            (Some(whole), y)
                        }
                        _ => (None, rt.allocate_tensor(placement, bytes, "y")?),
                    };
                    comm.run(rank, call, Some(&x), Some(&y))?;
                    let result = y.read_all()?;
                    drop(holder);
                    Ok::<_, NrtError>(result)
                })
            })
            .collect();
        ranks.into_iter().map(|t| t.join().expect("rank")).collect::<Vec<_>>()
    });
    for (rank, output) in outputs.into_iter().enumerate() {
        let output = common::floats(&output.expect("sums"));
        assert!(output.iter().all(|&v| v == 6.0), "rank {rank}: {:?}", &output[..4]);
    }
}

#[test]
fn send_recv_and_barrier_pair_ranks_in_order() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let comm = rt.communicator(&[2, 5]).expect("communicator");
    let tensor = |core: u32, bytes: &[u8]| {
        let t = rt.allocate_tensor(TensorPlacement::Device { core }, bytes.len() as u64, "t").expect("alloc");
        t.write(0, bytes).expect("write");
        t
    };
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for k in 0..3u8 {
                let call = CollectiveCall::new(Collective::Send { peer: 1 }, DType::U8);
                comm.run(0, &call, Some(&tensor(2, &[k; 16])), None).expect("sends");
            }
            comm.run(0, &CollectiveCall::new(Collective::Barrier, DType::U8), None, None).expect("barrier");
        });
        scope.spawn(|| {
            for k in 0..3u8 {
                let out = tensor(5, &[0; 16]);
                let call = CollectiveCall::new(Collective::Recv { peer: 0 }, DType::U8);
                comm.run(1, &call, None, Some(&out)).expect("receives");
                assert_eq!(out.read_all().expect("read"), [k; 16], "messages arrive in order");
            }
            comm.run(1, &CollectiveCall::new(Collective::Barrier, DType::U8), None, None).expect("barrier");
        });
    });
}

fn all_reduce_model(rt: &Runtime, name: &str, cores: &[u32]) -> Vec<Model> {
    let hlo = "HloModule ar\nsum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n\
               ENTRY e {\n  x = f32[8]{0} parameter(0)\n  two = f32[] constant(2)\n  t = f32[8]{0} broadcast(two), dimensions={}\n  \
               y = f32[8]{0} multiply(x, t)\n  ROOT r = f32[8]{0} all-reduce(y), replica_groups={}, to_apply=sum\n}\n";
    let neff = Neff::new(name, compile_hlo(hlo, Target::Trn1).expect("compiles")).encode();
    rt.load_collectives(&neff, cores).expect("loads")
}

/// Executes each model with input `inputs[r]` from its own thread.
fn execute_ranks(rt: &Runtime, models: &[&Model], inputs: &[Vec<f32>]) -> Vec<Result<Vec<f32>, NrtError>> {
    std::thread::scope(|scope| {
        let ranks: Vec<_> = models
            .iter()
            .zip(inputs)
            .map(|(model, input)| scope.spawn(move || common::execute_f32(rt, model, input)))
            .collect();
        ranks.into_iter().map(|r| r.join().expect("rank thread")).collect()
    })
}

#[test]
fn an_hlo_all_reduce_runs_across_the_cores_its_model_is_loaded_on() {
    let f = started(|config| config.host_threads = 1);
    let rt = &f.runtime;
    let models = all_reduce_model(rt, "ar", &[0, 1]);
    let inputs = vec![(0..8).map(|i| i as f32).collect::<Vec<_>>(), (0..8).map(|i| 10.0 * i as f32).collect()];
    let expected: Vec<f32> = (0..8).map(|i| 2.0 * (i as f32 + 10.0 * i as f32)).collect();
    for _ in 0..3 {
        // One host compute slot: each rank gives it up while it waits for the other.
        for output in execute_ranks(rt, &models.iter().collect::<Vec<_>>(), &inputs) {
            assert_eq!(output.expect("executes"), expected);
        }
    }

    let gather = "HloModule ag\nENTRY e {\n  x = f32[2,2]{1,0} parameter(0)\n  \
                  ROOT y = f32[2,8]{1,0} all-gather(x), replica_groups={{0,1,2,3}}, dimensions={1}\n}\n";
    let neff = Neff::new("ag", compile_hlo(gather, Target::Trn1).expect("compiles")).encode();
    let models = rt.load_collectives(&neff, &[4, 5, 6, 7]).expect("loads");
    let inputs: Vec<Vec<f32>> = (0..4).map(|r| (0..4).map(|i| (10 * r + i) as f32).collect()).collect();
    let outputs = execute_ranks(rt, &models.iter().collect::<Vec<_>>(), &inputs);
    // Row o of the result is row o of every rank's input, in rank order.
    let expected: Vec<f32> =
        (0..2).flat_map(|o| (0..4).flat_map(move |r| [(10 * r + 2 * o) as f32, (10 * r + 2 * o + 1) as f32])).collect();
    for output in outputs {
        assert_eq!(output.expect("executes"), expected);
    }

    let single = rt.load(&neff, Some(0)).expect_err("four ranks needed");
    assert_eq!(single.status, NrtStatus::Invalid);
    assert!(
        single.message.contains("is loaded as 1 rank(s), but its all-gather (HLO `y`) with replica_groups={{0,1,2,3}}")
            && single.message.contains("load it on 4 cores as 4 ranks"),
        "{single}"
    );
}

#[test]
fn partition_id_gives_each_rank_its_device_id_and_a_model_of_one_device_zero() {
    let f = started(|_| {});
    let rt = &f.runtime;
    // Each rank adds its device id to its input, then every rank gathers all of them.
    let hlo = "HloModule pid\nENTRY e {\n  x = f32[2]{0} parameter(0)\n  p = u32[] partition-id()\n  \
               c = f32[] convert(p)\n  b = f32[2]{0} broadcast(c), dimensions={}\n  y = f32[2]{0} add(x, b)\n  \
               ROOT g = f32[8]{0} all-gather(y), replica_groups={}, dimensions={0}, use_global_device_ids=true\n}\n";
    let neff = Neff::new("pid", compile_hlo(hlo, Target::Trn1).expect("compiles")).encode();
    let models = rt.load_collectives(&neff, &[4, 5, 6, 7]).expect("loads");
    let inputs = vec![vec![0.5f32, 1.5]; 4];
    for output in execute_ranks(rt, &models.iter().collect::<Vec<_>>(), &inputs) {
        assert_eq!(output.expect("executes"), [0.5, 1.5, 1.5, 2.5, 2.5, 3.5, 3.5, 4.5]);
    }
    // Not folded into a constant at compile time: the same NEFF gives each rank its own.
    let alone = "HloModule one\nENTRY e {\n  x = f32[] parameter(0)\n  p = u32[] partition-id()\n  \
                 c = f32[] convert(p)\n  ROOT y = f32[] add(x, c)\n}\n";
    let neff = Neff::new("one", compile_hlo(alone, Target::Trn1).expect("compiles")).encode();
    let model = rt.load(&neff, Some(0)).expect("loads");
    assert_eq!(common::execute_f32(rt, &model, &[0.25]).expect("executes"), [0.25], "one device: 0");
    let models = rt.load_collectives(&neff, &[4, 5]).expect("loads");
    let outputs = execute_ranks(rt, &models.iter().collect::<Vec<_>>(), &[vec![0.25], vec![0.25]]);
    let ids: Vec<Vec<f32>> = outputs.into_iter().map(|o| o.expect("executes")).collect();
    assert_eq!(ids, [[0.25], [1.25]]);
}

#[test]
fn a_missing_rank_fails_every_waiting_rank_after_the_timeout_and_the_ranks_meet_again() {
    let timeout = Duration::from_secs(1);
    let f = started(|config| config.exec_timeout = timeout);
    let rt = &f.runtime;
    let models = all_reduce_model(rt, "ar_missing.neff", &[0, 1, 2, 3]);
    let inputs: Vec<Vec<f32>> = (0..4).map(|r| vec![r as f32; 8]).collect();
    let started = Instant::now();
    // Rank 2 (nc2) never executes.
    let waiting: Vec<&Model> = [0, 1, 3].iter().map(|&r| &models[r]).collect();
    let outputs = execute_ranks(rt, &waiting, &[inputs[0].clone(), inputs[1].clone(), inputs[3].clone()]);
    let elapsed = started.elapsed();
    assert!(elapsed < timeout + Duration::from_secs(2), "ended after {elapsed:?}");
    for (output, core) in outputs.into_iter().zip([0u32, 1, 3]) {
        let error = output.expect_err("the group never completes");
        assert_eq!(error.status, NrtStatus::ExecHwErrCollectives, "{error}");
        let expected = format!(
            "missing collectives status on Neuron Device {} NC {}, model ar_missing.neff - suspected hang in collectives operation 0 out of 1",
            core / 2,
            core % 2
        );
        // What went wrong first, then the Neuron runtime's line.
        assert!(error.message.starts_with("rank 2 of replica group {0,1,2,3} did not arrive within "), "{error}");
        assert!(error.message.ends_with(&format!("; {expected}")), "{error}");
    }
    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens");
    let snapshot = reader.snapshot();
    assert_eq!(snapshot.core(0).expect("nc0").errors.get(neuron_datastore::ErrorClass::Hardware), 1);
    // Each waiting rank said once, after half the timeout, that it waited for rank 2.
    let mut tail = reader.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true);
    let mut events = Vec::new();
    tail.poll(&reader, usize::MAX, false, &mut events);
    let mut waiting: Vec<(u32, u32, u64)> = events
        .iter()
        .filter_map(|e| match e {
            TraceEvent::System(e) if e.event_type == EventType::CcWaiting => match e.data {
                EventData::CcWaiting { peer, rank, waited_ns, .. } => Some((rank, peer, waited_ns)),
                _ => None,
            },
            _ => None,
        })
        .collect();
    waiting.sort_unstable();
    assert_eq!(waiting.iter().map(|&(rank, peer, _)| (rank, peer)).collect::<Vec<_>>(), [(0, 2), (1, 2), (3, 2)]);
    assert!(waiting.iter().all(|&(_, _, waited)| waited >= 500_000_000), "{waiting:?}");

    // The process stays usable: all four ranks meet on their next execution.
    let outputs = execute_ranks(rt, &models.iter().collect::<Vec<_>>(), &inputs);
    for output in outputs {
        assert_eq!(output.expect("all ranks arrive"), vec![12.0; 8], "2 * (0 + 1 + 2 + 3)");
    }
}

#[test]
fn collectives_leave_cc_running_events_and_count_their_time() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens");
    let mut tail = reader.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true);
    let models = all_reduce_model(rt, "ar", &[0, 1]);
    let inputs = vec![vec![1.0; 8], vec![2.0; 8]];
    for output in execute_ranks(rt, &models.iter().collect::<Vec<_>>(), &inputs) {
        assert_eq!(output.expect("executes"), vec![6.0; 8]);
    }
    let comm = rt.communicator(&[2, 3]).expect("communicator");
    let call =
        CollectiveCall::new(Collective::AllGather, DType::F32).groups(vec![vec![0, 1]]).algorithm(Algorithm::Ring);
    run_ranks(rt, &comm, &call, &[f32_bytes(&[1.0; 4]), f32_bytes(&[2.0; 4])], 32).into_iter().for_each(|r| {
        r.expect("runs");
    });
    let mut events = Vec::new();
    tail.poll(&reader, usize::MAX, false, &mut events);
    let collectives: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            TraceEvent::System(e) if e.event_type == EventType::CcRunning => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(collectives.len(), 8, "a start and a stop per rank and operation: {collectives:#?}");
    for event in &collectives {
        let EventData::Collective {
            operation,
            algorithm,
            bytes,
            replica_group,
            op_id,
            rank,
            sequence,
            communicator,
            status,
        } = &event.data
        else {
            panic!("cc_running carries collective data: {event:?}")
        };
        assert_eq!(*status, None);
        assert_eq!((*op_id, *sequence), (0, 0), "the first collective of each rank");
        assert_eq!(replica_group, "{0,1}");
        assert_eq!(*rank, event.nc_idx.expect("on a core") % 2, "nc0 and nc2 are rank 0 of their communicators");
        let id_of = |core| collectives.iter().find(|e| e.nc_idx == Some(core)).map(|e| e.data.clone());
        match event.nc_idx {
            Some(0 | 1) => {
                assert_eq!((*operation, *algorithm, *bytes), ("all-reduce", "all-to-all", 32));
                assert!(event.exec_id.is_some() && event.model_id.is_some(), "{event:?}");
                assert!(
                    matches!(id_of(0), Some(EventData::Collective { communicator: c, .. }) if c == *communicator),
                    "the ranks of one communicator carry its id"
                );
            }
            Some(2 | 3) => {
                assert_eq!((*operation, *algorithm, *bytes), ("all-gather", "ring", 32));
                assert!(
                    !matches!(id_of(0), Some(EventData::Collective { communicator: c, .. }) if c == *communicator),
                    "another communicator, another id"
                );
            }
            other => panic!("cc_running on {other:?}"),
        }
    }
    assert!(collectives.iter().any(|e| e.phase == Phase::Start) && collectives.iter().any(|e| e.phase == Phase::Stop));
    let snapshot = reader.snapshot();
    for core in 0..4 {
        let counters = snapshot.core(core).expect("held");
        assert_eq!(counters.collectives, 1, "nc{core}");
        assert!(counters.collectives_ns > 0, "nc{core}");
    }
    assert_eq!(snapshot.core(4).expect("held").collectives, 0);
}

#[test]
fn scheduled_collectives_run_on_the_collectives_units() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let comm = rt.communicator(&[0, 1, 2]).expect("communicator");
    let ty = ArrayType::new(DType::F32, vec![6]);
    let mut outputs = Vec::new();
    let mut seqs = Vec::new();
    let tracker = rt.error_tracker_create(1).expect("tracker");
    for rank in 0..3u32 {
        let core = comm.core(rank).expect("rank");
        let x = rt.allocate_tensor_for(TensorPlacement::Device { core }, &ty, "x").expect("alloc");
        x.write(0, &f32_bytes(&[rank as f32 + 1.0; 6])).expect("write");
        let y = rt.allocate_tensor_for(TensorPlacement::Device { core }, &ty, "y").expect("alloc");
        let call = CollectiveCall::new(Collective::ReduceScatter(ReduceOp::Maximum), DType::F32);
        let y_part = y.slice(0, 8, "y-part").expect("slice");
        let seq = rt
            .collective_schedule(&comm, rank, call, Some(&x), Some(&y_part), (rank == 1).then_some(&tracker))
            .expect("scheduled");
        assert_eq!((seq.core(), seq.xu()), (core, Some(neuron_runtime::Xu::Collectives)));
        seqs.push(seq);
        outputs.push(y_part);
    }
    for seq in &seqs {
        rt.wait_sequence(*seq, Duration::from_secs(30)).expect("completes");
    }
    assert!(tracker.errors().is_empty());
    for output in outputs {
        assert_eq!(common::floats(&output.read_all().expect("read")), [3.0, 3.0]);
    }
}

#[test]
fn bad_calls_are_refused_with_clear_errors() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let duplicate = rt.communicator(&[1, 1]).expect_err("one core twice");
    assert!(duplicate.message.contains("nc1 appears twice"), "{duplicate}");
    let comm = rt.communicator(&[0, 1]).expect("communicator");
    let x = rt.allocate_tensor(TensorPlacement::Device { core: 0 }, 16, "x").expect("alloc");
    let y = rt.allocate_tensor(TensorPlacement::Device { core: 0 }, 16, "y").expect("alloc");
    let call = CollectiveCall::new(Collective::AllReduce(ReduceOp::Add), DType::F32).groups(vec![vec![0]]);
    let left_out = comm.run(0, &call, Some(&x), Some(&y)).expect_err("rank 1 in no group");
    assert!(left_out.message.contains("leave out rank 1"), "{left_out}");
    let call = CollectiveCall::new(Collective::AllGather, DType::F32);
    let wrong_size = comm.run(0, &call, Some(&x), Some(&y)).expect_err("a gather of 2 doubles its input");
    assert!(
        wrong_size.message.contains("all-gather in a group of 2 ranks cannot take 16 bytes in and give 16"),
        "{wrong_size}"
    );
    let missing = comm.run(5, &call, Some(&x), Some(&y)).expect_err("no rank 5");
    assert!(missing.message.contains("rank 5 does not exist"), "{missing}");
}

#[test]
fn ranks_that_disagree_fail_without_harm_and_meet_again() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let comm = rt.communicator(&[0, 1, 2]).expect("communicator");
    let inputs: Vec<Vec<u8>> = (0..3).map(|r| f32_bytes(&[r as f32; 6])).collect();
    let sum =
        |groups: Vec<Vec<u32>>| CollectiveCall::new(Collective::AllReduce(ReduceOp::Add), DType::F32).groups(groups);
    // Rank 1 thinks the groups are {0,1},{2}; ranks 0 and 2 think there is one group.
    let outcomes = std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..3u32)
            .map(|rank| {
                let (comm, input) = (&comm, &inputs[rank as usize]);
                let call = if rank == 1 { sum(vec![vec![0, 1], vec![2]]) } else { sum(vec![]) };
                scope.spawn(move || {
                    let core = comm.core(rank).expect("rank");
                    let x = rt.allocate_tensor(TensorPlacement::Device { core }, 24, "x").expect("alloc");
                    x.write(0, input).expect("write");
                    let y = rt.allocate_tensor(TensorPlacement::Device { core }, 24, "y").expect("alloc");
                    comm.run(rank, &call, Some(&x), Some(&y))
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().expect("no rank panics")).collect::<Vec<_>>()
    });
    assert!(outcomes.iter().all(Result::is_err), "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .any(|o| o.as_ref().is_err_and(|e| e.status == NrtStatus::Invalid && e.message.contains("do not match"))),
        "{outcomes:?}"
    );
    // The next calls agree and meet.
    for output in run_ranks(rt, &comm, &sum(vec![]), &inputs, 24) {
        assert_eq!(common::floats(&output.expect("runs")), [3.0; 6]);
    }
}
