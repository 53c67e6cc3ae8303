//! Communicators across processes, with each "process" a runtime of its own in this test
//! (its own cores, its own bootstrap connection to rank 0's runtime, its own data
//! links): programs and API collectives against a reference, and every failure kind
//! with its status, the rank it names and the bound on time. Real processes under
//! `mpirun` are in `libnrt/tests` and `profiler/tests`.

use std::time::{Duration, Instant};

use neuron_runtime::launch::RootComm;
use neuron_runtime::{
    Collective, CollectiveCall, Communicator, CoreSet, DType, GLOBAL_COMMUNICATOR, Model, Neff, NrtError, NrtStatus,
    Target, Tensor, TensorPlacement, TensorSet, compile_hlo,
};
use neuron_test_support::runtime::{self as common, f32_bytes};

mod flight;

/// A free port on the loopback interface for rank 0 to listen at.
fn free_root() -> RootComm {
    let port = neuron_test_support::process::free_port();
    RootComm { host: "127.0.0.1".into(), port, from: "NEURON_RT_ROOT_COMM_ID" }
}

/// `processes` runtimes of `cores` cores each, all pointed at the same root.
fn job(processes: usize, cores: u32, timeout: Duration) -> Vec<common::Fixture> {
    job_with_faults(processes, cores, timeout, None)
}

/// The same, every process with `NEURON_RT_FAULT_INJECT=faults`.
fn job_with_faults(processes: usize, cores: u32, timeout: Duration, faults: Option<&str>) -> Vec<common::Fixture> {
    let root = free_root();
    (0..processes)
        .map(|_| {
            common::started(CoreSet::range(0, cores - 1), |config| {
                config.root_comm = Some(root.clone());
                config.exec_timeout = timeout;
                config.host_threads = 1;
                if let Some(faults) = faults {
                    config.faults = neuron_runtime::fault::parse_rules(faults, 64).expect("fault rules");
                }
            })
        })
        .collect()
}

fn all_reduce_neff(elements: usize) -> Vec<u8> {
    let hlo = format!(
        "HloModule ar\nsum {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}}\n\
         ENTRY e {{\n  x = f32[{elements}]{{0}} parameter(0)\n  \
         ROOT r = f32[{elements}]{{0}} all-reduce(x), replica_groups={{}}, to_apply=sum\n}}\n"
    );
    Neff::new("ar_ranks", compile_hlo(&hlo, Target::Trn1).expect("compiles")).encode()
}

/// Rank `r` of the job as (process, core): `per_process` consecutive ranks per process.
fn place(rank: usize, per_process: usize) -> (usize, u32) {
    (rank / per_process, (rank % per_process) as u32)
}

/// Loads the all-reduce of `elements` floats as every rank of `job` and runs each rank
/// from its own thread `times` times with input `rank + 1` (rank `skip` never runs).
fn run_all_reduce(
    job: &[common::Fixture],
    per_process: usize,
    elements: usize,
    times: usize,
    skip: Option<usize>,
) -> Vec<Result<Vec<f32>, NrtError>> {
    let neff = all_reduce_neff(elements);
    let ranks = job.len() * per_process;
    let models: Vec<Model> = (0..ranks)
        .map(|rank| {
            let (process, core) = place(rank, per_process);
            job[process].runtime.load_collectives_across(&neff, core, rank as u32, ranks as u32).expect("loads")
        })
        .collect();
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..ranks)
            .filter(|&rank| Some(rank) != skip)
            .map(|rank| {
                let (rt, model) = (&job[place(rank, per_process).0].runtime, &models[rank]);
                scope.spawn(move || {
                    let input = vec![(rank + 1) as f32; elements];
                    let mut last = Ok(Vec::new());
                    for _ in 0..times {
                        last = common::execute_f32(rt, model, &input);
                        if last.is_err() {
                            break;
                        }
                    }
                    last
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("rank thread")).collect()
    })
}

#[test]
fn a_program_all_reduce_spans_processes_of_one_and_of_two_cores() {
    for (processes, per_process) in [(4, 1), (2, 2)] {
        let job = job(processes, per_process as u32, Duration::from_secs(20));
        let ranks = processes * per_process;
        let expected = (1..=ranks).sum::<usize>() as f32;
        // A small exchange (all-to-all) and a large one (the ring, from 16 MiB of traffic).
        for elements in [8, 3 << 20] {
            for output in run_all_reduce(&job, per_process, elements, 3, None) {
                let output = output.unwrap_or_else(|e| panic!("{processes}x{per_process}, {elements}: {e}"));
                assert_eq!(output.len(), elements);
                assert!(output.iter().all(|&v| v == expected), "{processes}x{per_process}: {:?}", &output[..4]);
            }
        }
    }
}

/// Runs `call` as every rank of communicator `name` (rank r in process r / per_process)
/// with input `inputs[r]`, returning each rank's output.
fn run_api(
    job: &[common::Fixture],
    per_process: usize,
    name: &str,
    call: &CollectiveCall,
    inputs: &[Vec<u8>],
    output_bytes: usize,
) -> Vec<Result<Vec<u8>, NrtError>> {
    let ranks = inputs.len();
    let comms: Vec<Communicator> = (0..ranks)
        .map(|rank| {
            let (process, core) = place(rank, per_process);
            job[process].runtime.join_communicator(name, core, rank as u32, ranks as u32).expect("joins")
        })
        .collect();
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..ranks)
            .map(|rank| {
                let (comm, input) = (&comms[rank], &inputs[rank]);
                let rt = &job[place(rank, per_process).0].runtime;
                scope.spawn(move || {
                    let core = place(rank, per_process).1;
                    let x = rt.allocate_tensor(TensorPlacement::Device { core }, input.len().max(1) as u64, "x")?;
                    x.write(0, input)?;
                    let y = rt.allocate_tensor(TensorPlacement::Device { core }, output_bytes.max(1) as u64, "y")?;
                    comm.run(rank as u32, call, Some(&x), Some(&y))?;
                    y.read_all()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("rank thread")).collect()
    })
}

#[test]
fn api_collectives_gather_and_scatter_across_processes() {
    let job = job(2, 2, Duration::from_secs(20));
    let inputs: Vec<Vec<u8>> = (0..4u8).map(|r| vec![r + 1; 8]).collect();
    let gathered =
        run_api(&job, 2, GLOBAL_COMMUNICATOR, &CollectiveCall::new(Collective::AllGather, DType::U8), &inputs, 32);
    let expected: Vec<u8> = (1..=4u8).flat_map(|r| [r; 8]).collect();
    for output in gathered {
        assert_eq!(output.expect("gathers"), expected);
    }
    // Reduce-scatter by the ring: rank r gets part r of the sums.
    let inputs: Vec<Vec<u8>> =
        (0..4).map(|r| f32_bytes(&(0..16).map(|i| (i * 10 + r) as f32).collect::<Vec<_>>())).collect();
    let call = CollectiveCall::new(Collective::ReduceScatter(neuron_runtime::isa::ReduceOp::Add), DType::F32)
        .algorithm(neuron_runtime::Algorithm::Ring);
    let outputs = run_api(&job, 2, "scatter", &call, &inputs, 16);
    for (rank, output) in outputs.into_iter().enumerate() {
        let expected: Vec<f32> = (0..4).map(|i| ((rank * 4 + i) * 40 + 6) as f32).collect();
        assert_eq!(common::floats(&output.expect("scatters")), expected, "rank {rank}");
    }
}

/// Whether this process holds an outbox area (shared memory a peer reads in place).
fn holds_an_outbox_area() -> bool {
    std::fs::read_dir("/proc/self/fd")
        .expect("fds")
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy().contains("neuron-virt-outbox")))
}

#[test]
fn large_collectives_read_the_messages_of_processes_of_this_host_in_place() {
    let job = job(2, 2, Duration::from_secs(30));
    let (ranks, elements) = (4usize, 64 << 10);
    let values = |r: usize| (0..elements).map(|i| (i % 1000) as f32 + r as f32 * 0.5).collect::<Vec<f32>>();
    let values: Vec<Vec<f32>> = (0..ranks).map(values).collect();
    let inputs: Vec<Vec<u8>> = values.iter().map(|v| f32_bytes(v)).collect();
    let sums: Vec<f32> = (0..elements).map(|i| values.iter().map(|v| v[i]).sum()).collect();
    let part = elements / ranks;
    let sum = Collective::AllReduce(neuron_runtime::isa::ReduceOp::Add);
    let scatter = Collective::ReduceScatter(neuron_runtime::isa::ReduceOp::Add);
    for algorithm in [neuron_runtime::Algorithm::AllToAll, neuron_runtime::Algorithm::Ring] {
        let name = format!("{algorithm:?}");
        let call = |op| CollectiveCall::new(op, DType::F32).algorithm(algorithm);
        for (rank, output) in
            run_api(&job, 2, &format!("sum {name}"), &call(sum), &inputs, elements * 4).into_iter().enumerate()
        {
            assert!(common::floats(&output.expect("sums")) == sums, "{name}: rank {rank}'s sum");
        }
        let scattered = run_api(&job, 2, &format!("scatter {name}"), &call(scatter), &inputs, part * 4);
        for (rank, output) in scattered.into_iter().enumerate() {
            assert!(
                common::floats(&output.expect("scatters")) == sums[rank * part..][..part],
                "{name}: rank {rank}'s part"
            );
        }
        let gathered =
            run_api(&job, 2, &format!("gather {name}"), &call(Collective::AllGather), &inputs, elements * 4 * ranks);
        for output in gathered {
            assert!(output.expect("gathers") == inputs.concat(), "{name}: gathered");
        }
    }
    let exchanged =
        run_api(&job, 2, "all-to-all", &CollectiveCall::new(Collective::AllToAll, DType::F32), &inputs, elements * 4);
    for (rank, output) in exchanged.into_iter().enumerate() {
        let expected: Vec<u8> =
            (0..ranks).flat_map(|from| inputs[from][rank * part * 4..][..part * 4].to_vec()).collect();
        assert!(output.expect("exchanges") == expected, "rank {rank}'s parts");
    }
    assert!(holds_an_outbox_area(), "messages of 256 KiB between processes of one host lie in shared memory");
}

/// How many times this process maps each memfd of tensor memory of a tensor named
/// `lend-…` (its owner's mapping, then one per runtime that reads it where it lies).
fn tensor_mappings() -> std::collections::HashMap<u64, usize> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    let mut count = std::collections::HashMap::new();
    for line in maps.lines().filter(|l| l.contains("memfd:neuron-virt-tensor:lend-")) {
        let inode: u64 = line.split_whitespace().nth(4).and_then(|i| i.parse().ok()).expect("inode");
        *count.entry(inode).or_default() += 1;
    }
    count
}

#[test]
fn an_all_reduce_of_large_tensors_reads_them_where_they_lie_in_the_processes_of_this_host() {
    let job = job(3, 1, Duration::from_secs(30));
    // 8.8 MB per rank: by size alone the ring (see `choose_algorithm`), which lends
    // nothing; ranks in processes of one host sum all-to-all, by parts.
    let (ranks, elements) = (3usize, 2_200_001);
    let values = |r: usize| (0..elements).map(|i| (i % 977) as f32 * 0.37 + r as f32 * 1.1).collect::<Vec<f32>>();
    let values: Vec<Vec<f32>> = (0..ranks).map(values).collect();
    let inputs: Vec<Vec<u8>> = values.iter().map(|v| f32_bytes(v)).collect();
    // Summed in group order, as every algorithm does for each element.
    let sums: Vec<f32> = (0..elements).map(|i| (values[0][i] + values[1][i]) + values[2][i]).collect();
    let comms: Vec<Communicator> =
        (0..ranks).map(|r| job[r].runtime.join_communicator("lend", 0, r as u32, 3).expect("joins")).collect();
    assert_eq!(
        neuron_runtime::collectives::choose_algorithm(elements as u64 * 4, ranks),
        neuron_runtime::Algorithm::Ring
    );
    let call = CollectiveCall::new(Collective::AllReduce(neuron_runtime::isa::ReduceOp::Add), DType::F32);
    // Every rank lends (twice: the peers let the first tensors go once freed); then
    // rank 1 sums in place (its one tensor lent as input and output) and rank 2 from
    // host memory (not shared: it sends its input and its finished part instead).
    let mut first_round = Vec::new();
    // Last, every rank sums in place, as training loops do.
    let rounds: [(&[usize], &[usize]); 4] = [(&[], &[]), (&[], &[]), (&[1], &[2]), (&[0, 1, 2], &[])];
    for (round, (in_place, on_host)) in rounds.into_iter().enumerate() {
        let tensors: Vec<(Tensor, Tensor)> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..ranks)
                .map(|rank| {
                    let (comm, input, rt, call) = (&comms[rank], &inputs[rank], &job[rank].runtime, &call);
                    scope.spawn(move || {
                        let device = TensorPlacement::Device { core: 0 };
                        let placement = if on_host.contains(&rank) { TensorPlacement::Host } else { device };
                        let x = rt.allocate_tensor(placement, input.len() as u64, "lend-x").expect("alloc");
                        x.write(0, input).expect("write");
                        let y = match in_place.contains(&rank) {
                            true => x.clone(),
                            false => rt.allocate_tensor(device, input.len() as u64, "lend-y").expect("alloc"),
                        };
                        comm.run(rank as u32, call, Some(&x), Some(&y)).expect("sums");
                        (x, y)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().expect("rank thread")).collect()
        });
        for (rank, (x, y)) in tensors.iter().enumerate() {
            assert!(common::floats(&y.read_all().expect("read")) == sums, "round {round}: rank {rank}'s sum");
            if !in_place.contains(&rank) {
                assert!(x.read_all().expect("read") == inputs[rank], "round {round}: rank {rank}'s input is unchanged");
            }
        }
        let mappings = tensor_mappings();
        match round {
            0 => {
                // Each rank's input and output: its own mapping and the two peers'.
                assert_eq!(mappings.len(), 2 * ranks, "{mappings:?}");
                assert!(mappings.values().all(|&n| n == 3), "{mappings:?}");
                first_round = mappings.into_keys().collect();
            }
            // The peers let the tensors of the first round go once they were freed.
            1 => assert!(first_round.iter().all(|inode| !mappings.contains_key(inode)), "{mappings:?}"),
            // One tensor per rank, each lent to both peers.
            3 => assert_eq!(mappings.values().filter(|&&n| n == 3).count(), ranks, "{mappings:?}"),
            _ => {
                // Rank 0's two tensors and rank 1's one are lent; rank 2's output is
                // not. The peers let the freed tensors of the second round go at its
                // first message.
                let lent = mappings.values().filter(|&&n| n == 3).count();
                assert_eq!(lent, 3, "{mappings:?}");
                assert!(mappings.values().all(|&n| n != 2), "{mappings:?}");
            }
        }
    }
}

#[test]
fn a_programs_all_reduce_of_device_tensors_lends_them_as_an_api_call_does() {
    let job = job(3, 1, Duration::from_secs(30));
    let (ranks, elements) = (3usize, 2_200_001);
    let neff = all_reduce_neff(elements);
    let values = |r: usize| (0..elements).map(|i| (i % 977) as f32 * 0.37 + r as f32 * 1.1).collect::<Vec<f32>>();
    let mut values: Vec<Vec<f32>> = (0..ranks).map(values).collect();
    // A NaN and two infinities, in three ranks' parts: every rank's output holds them,
    // summed by its own rank or copied from another's, and counted either way.
    values[0][5] = f32::NAN;
    values[1][elements - 3] = f32::INFINITY;
    values[2][elements / 2] = f32::NEG_INFINITY;
    // Summed in group order, as every algorithm does for each element.
    let sums: Vec<f32> = (0..elements).map(|i| (values[0][i] + values[1][i]) + values[2][i]).collect();
    let same =
        |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan());
    let models: Vec<Model> = (0..ranks)
        .map(|rank| job[rank].runtime.load_collectives_across(&neff, 0, rank as u32, ranks as u32).expect("loads"))
        .collect();
    let mut first_round = Vec::new();
    for round in 0..2 {
        let outputs: Vec<(Tensor, Tensor)> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..ranks)
                .map(|rank| {
                    let (rt, model, input) = (&job[rank].runtime, &models[rank], f32_bytes(&values[rank]));
                    scope.spawn(move || {
                        let device = TensorPlacement::Device { core: 0 };
                        let x = rt.allocate_tensor(device, input.len() as u64, "lend-px").expect("alloc");
                        x.write(0, &input).expect("write");
                        let y = rt.allocate_tensor(device, input.len() as u64, "lend-py").expect("alloc");
                        let (mut inputs, mut outputs) = (TensorSet::new(), TensorSet::new());
                        inputs.add("input0", x.clone());
                        outputs.add("output0", y.clone());
                        let report = rt.execute(model, &inputs, &outputs).expect("sums");
                        assert_eq!(report.numerical_errors, 3, "rank {rank}: one NaN and two infinities");
                        (x, y)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().expect("rank thread")).collect()
        });
        for (rank, (x, y)) in outputs.iter().enumerate() {
            assert!(same(&common::floats(&y.read_all().expect("read")), &sums), "round {round}: rank {rank}'s sum");
            assert!(same(&common::floats(&x.read_all().expect("read")), &values[rank]), "rank {rank}'s input");
        }
        // Each rank's input and output tensors: its own mapping and the two peers'.
        let mappings = tensor_mappings();
        if round == 0 {
            assert_eq!(mappings.len(), 2 * ranks, "{mappings:?}");
            assert!(mappings.values().all(|&n| n == 3), "{mappings:?}");
            first_round = mappings.into_keys().collect();
        } else {
            assert!(first_round.iter().all(|inode| !mappings.contains_key(inode)), "{mappings:?}");
        }
    }
}

#[test]
fn send_and_recv_pass_messages_in_order_within_and_across_processes() {
    // Ranks 0 and 1 in one process, 2 and 3 in the other: around the ring 0 → 1 and
    // 2 → 3 stay in a process, 1 → 2 and 3 → 0 cross.
    let job = job(2, 2, Duration::from_secs(20));
    let comms: Vec<Communicator> = (0..4)
        .map(|rank| {
            let (process, core) = place(rank, 2);
            job[process].runtime.join_communicator("p2p", core, rank as u32, 4).expect("joins")
        })
        .collect();
    let received: Vec<Vec<Vec<u8>>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..4u32)
            .map(|rank| {
                let comm = &comms[rank as usize];
                let (process, core) = place(rank as usize, 2);
                let rt = &job[process].runtime;
                scope.spawn(move || {
                    let placement = TensorPlacement::Device { core };
                    let (next, previous) = ((rank + 1) % 4, (rank + 3) % 4);
                    for k in 0..3u8 {
                        let x = rt.allocate_tensor(placement, 4, "x").expect("alloc");
                        x.write(0, &[rank as u8, k, 7, 7]).expect("write");
                        comm.run(
                            rank,
                            &CollectiveCall::new(Collective::Send { peer: next }, DType::U8),
                            Some(&x),
                            None,
                        )
                        .expect("sends");
                    }
                    (0..3)
                        .map(|_| {
                            let y = rt.allocate_tensor(placement, 4, "y").expect("alloc");
                            let call = CollectiveCall::new(Collective::Recv { peer: previous }, DType::U8);
                            comm.run(rank, &call, None, Some(&y)).expect("receives");
                            y.read_all().expect("read")
                        })
                        .collect()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("rank thread")).collect()
    });
    for (rank, messages) in received.iter().enumerate() {
        let previous = ((rank + 3) % 4) as u8;
        let expected: Vec<Vec<u8>> = (0..3).map(|k| vec![previous, k, 7, 7]).collect();
        assert_eq!(messages, &expected, "rank {rank}: its predecessor's three messages, in order");
    }
}

#[test]
fn a_rank_that_never_arrives_fails_the_others_at_the_timeout_naming_it_and_the_survivors_go_on() {
    let timeout = Duration::from_secs(1);
    let job = job(3, 1, timeout);
    let started = Instant::now();
    let outputs = run_all_reduce(&job, 1, 8, 1, Some(2));
    let elapsed = started.elapsed();
    assert!(elapsed < timeout + Duration::from_secs(2), "ended after {elapsed:?}");
    for output in outputs {
        let error = output.expect_err("rank 2 never arrives");
        assert_eq!(error.status, NrtStatus::ExecHwErrCollectives, "{error}");
        assert!(error.message.contains("suspected hang in collectives operation 0 out of 1"), "{error}");
        // The rank that timed out names the missing one first; the other hears of it
        // from the first, and says that first too.
        assert!(
            error.message.starts_with(&format!("rank 2 (pid {} on host", std::process::id()))
                && error.message.contains(" never reached all-reduce #0 of comm ")
                && error.message.contains("within 1.000 s; "),
            "{error}"
        );
    }
    // The two survivors build a communicator of their own and go on.
    let inputs = vec![vec![1u8; 4], vec![2u8; 4]];
    let gathered = run_api(&job, 1, "survivors", &CollectiveCall::new(Collective::AllGather, DType::U8), &inputs, 8);
    for output in gathered {
        assert_eq!(output.expect("the survivors' communicator works"), [1, 1, 1, 1, 2, 2, 2, 2]);
    }
}

#[test]
fn a_communicator_a_process_left_before_joining_times_out_naming_the_process() {
    let mut job = job(3, 1, Duration::from_secs(30));
    let comm0 = job[0].runtime.join_communicator("three", 0, 0, 3).expect("joins");
    let comm1 = job[1].runtime.join_communicator("three", 0, 1, 3).expect("joins");
    // The third process reaches rank 0 (for another communicator), then leaves.
    let other = job[2].runtime.join_communicator("other", 0, 1, 2).expect("joins");
    std::thread::sleep(Duration::from_millis(300));
    drop(other);
    job.pop().expect("third process").runtime.close().expect("closes");
    for comm in [&comm0, &comm1] {
        let error = comm.wait_for_ranks(Instant::now() + Duration::from_secs(2)).expect_err("rank 2 never joins");
        assert_eq!(error.status, NrtStatus::Timeout, "{error}");
        assert!(
            error.message.contains("not every rank of `three` joined")
                && error.message.contains("processes of the job that left before it completed")
                && error.message.contains(&format!("pid {}", std::process::id())),
            "{error}"
        );
    }
}

#[test]
fn processes_that_load_different_programs_are_told_so_naming_which_ranks_loaded_which() {
    let timeout = Duration::from_secs(60);
    let job = job(2, 1, timeout);
    // Process 0 loads one all-reduce as rank 0, process 1 another as rank 1: neither
    // program's communicator can complete.
    let (one, other) = (all_reduce_neff(8), all_reduce_neff(16));
    let model0 = job[0].runtime.load_collectives_across(&one, 0, 0, 2).expect("loads");
    let model1 = job[1].runtime.load_collectives_across(&other, 0, 1, 2).expect("loads");
    let started = Instant::now();
    let errors: Vec<NrtError> = std::thread::scope(|scope| {
        let runs = [(&job[0], &model0, 8), (&job[1], &model1, 16)].map(|(fixture, model, len)| {
            scope.spawn(move || common::execute_f32(&fixture.runtime, model, &vec![1.0; len]))
        });
        runs.map(|run| run.join().expect("rank thread").expect_err("cannot complete")).into()
    });
    let waited = started.elapsed();
    for error in &errors {
        assert!(
            error.message.contains("the job's processes loaded different programs of 2 ranks")
                && error.message.contains("rank 0 (pid")
                && error.message.contains("rank 1 (pid")
                && error.message.contains("load the same NEFF in every process"),
            "{error}"
        );
    }
    // Said well before the timeout.
    eprintln!("after {waited:?}: {}", errors[0]);
    assert!(waited < timeout / 2, "{waited:?}");
}

#[test]
fn processes_given_different_secrets_refuse_each_other_and_rank_0_says_so_at_its_timeout() {
    use neuron_runtime::config::{JobAuth, JobSecret};
    let root = free_root();
    let job: Vec<common::Fixture> = ["one secret of twenty bytes", "another secret, as long"]
        .into_iter()
        .map(|secret| {
            common::started(CoreSet::range(0, 0), |config| {
                config.root_comm = Some(root.clone());
                config.exec_timeout = Duration::from_secs(3);
                config.job_auth = JobAuth::Secret(JobSecret::Value(secret.into()));
            })
        })
        .collect();
    let comm0 = job[0].runtime.join_communicator("secrets", 0, 0, 2).expect("joins");
    let comm1 = job[1].runtime.join_communicator("secrets", 0, 1, 2).expect("joins");
    let error = comm1.wait_for_ranks(Instant::now() + Duration::from_secs(10)).expect_err("refused");
    assert!(
        error.message.contains("is not of this job") && error.message.contains("NEURON_VIRT_JOB_SECRET"),
        "{error}"
    );
    let error = comm0.wait_for_ranks(Instant::now() + Duration::from_secs(3)).expect_err("rank 1 never joins");
    assert!(
        error.message.contains("rank 0 refused 1 connection(s) that could not prove they belong to the job"),
        "{error}"
    );
}

/// Rank 0 of a two-process job calls `call` (with an output on its core when
/// `output_bytes` is not 0) while rank 1's process closes, 200 ms in: its links and its
/// bootstrap connection close. Rank 0's error, which must come at once, with 1206.
fn call_while_the_peer_process_closes(
    name: &str,
    call: &CollectiveCall,
    (input_bytes, output_bytes): (u64, u64),
) -> NrtError {
    let mut job = job(2, 1, Duration::from_secs(30));
    let comm0 = job[0].runtime.join_communicator(name, 0, 0, 2).expect("joins");
    let comm1 = job[1].runtime.join_communicator(name, 0, 1, 2).expect("joins");
    comm0.wait_for_ranks(Instant::now() + Duration::from_secs(10)).expect("every rank joins");
    comm1.wait_for_ranks(Instant::now() + Duration::from_secs(10)).expect("every rank joins");
    let placement = TensorPlacement::Device { core: 0 };
    let tensor =
        |bytes: u64, name| (bytes > 0).then(|| job[0].runtime.allocate_tensor(placement, bytes, name).expect("alloc"));
    let (input, output) = (tensor(input_bytes, "x"), tensor(output_bytes, "y"));
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            let started = Instant::now();
            (comm0.run(0, call, input.as_ref(), output.as_ref()), started.elapsed())
        });
        std::thread::sleep(Duration::from_millis(200));
        drop(comm1);
        job.pop().expect("second process").runtime.close().expect("closes");
        let (result, waited) = waiting.join().expect("rank 0");
        let error = result.expect_err("rank 1 is gone");
        assert_eq!(error.status, NrtStatus::NetworkProxyFailure, "{error}");
        assert!(waited < Duration::from_secs(3), "rank 0 waited {waited:?} for a peer that was gone");
        error
    })
}

#[test]
fn a_process_that_goes_away_fails_its_peers_at_once_with_a_network_failure() {
    let error =
        call_while_the_peer_process_closes("gone", &CollectiveCall::new(Collective::Barrier, DType::U8), (0, 0));
    assert!(
        error.message.contains("connection closed by remote peer") && error.message.contains("rank 1 (pid"),
        "{error}"
    );
}

#[test]
fn a_recv_from_a_process_that_goes_away_fails_at_once_with_a_network_failure() {
    let recv = CollectiveCall::new(Collective::Recv { peer: 1 }, DType::U8);
    let error = call_while_the_peer_process_closes("gone-p2p", &recv, (0, 4));
    assert!(error.message.contains("got no data from rank 1 (pid"), "{error}");
}

#[test]
fn an_all_reduce_that_lends_its_tensors_to_a_process_that_goes_away_fails_at_once() {
    let sum = CollectiveCall::new(Collective::AllReduce(neuron_runtime::isa::ReduceOp::Add), DType::F32);
    let error = call_while_the_peer_process_closes("gone-lent", &sum, (4 << 20, 4 << 20));
    assert!(error.message.contains("rank 1 (pid"), "{error}");
}

#[test]
fn ranks_calling_different_operations_fail_naming_both_sides() {
    let job = job(2, 1, Duration::from_secs(20));
    let comms: Vec<Communicator> =
        (0..2).map(|r| job[r].runtime.join_communicator("mismatch", 0, r as u32, 2).expect("joins")).collect();
    let outputs: Vec<Result<(), NrtError>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2usize)
            .map(|rank| {
                let (rt, comm) = (&job[rank].runtime, &comms[rank]);
                scope.spawn(move || {
                    // Rank 1 all-reduces twice as many elements.
                    let bytes = 16 * (rank as u64 + 1);
                    let x = rt.allocate_tensor(TensorPlacement::Host, bytes, "x")?;
                    let y = rt.allocate_tensor(TensorPlacement::Host, bytes, "y")?;
                    let call =
                        CollectiveCall::new(Collective::AllReduce(neuron_runtime::isa::ReduceOp::Add), DType::F32);
                    comm.run(rank as u32, &call, Some(&x), Some(&y))
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("rank thread")).collect()
    });
    for (rank, output) in outputs.into_iter().enumerate() {
        let error = output.expect_err("the calls differ");
        assert!(error.message.contains("16 bytes in") && error.message.contains("32 bytes in"), "rank {rank}: {error}");
        assert!(error.message.contains("rank 0 (pid") && error.message.contains("rank 1 (pid"), "rank {rank}: {error}");
    }
}

#[test]
fn a_root_that_is_never_reached_gives_up_with_a_timeout() {
    let root = free_root();
    // Only rank 1 exists: nobody listens at the root.
    let f = common::started(CoreSet::range(0, 0), |config| {
        config.root_comm = Some(root.clone());
        config.exec_timeout = Duration::from_millis(500);
    });
    let comm = f.runtime.join_communicator("alone", 0, 1, 2).expect("joins");
    let started = Instant::now();
    let error = comm.wait_for_ranks(Instant::now() + Duration::from_secs(10)).expect_err("no root");
    assert!(started.elapsed() < Duration::from_secs(3), "gave up after {:?}", started.elapsed());
    assert_eq!(error.status, NrtStatus::Timeout, "{error}");
    assert!(error.message.contains(&format!("Connect to 127.0.0.1:{} failed", root.port)), "{error}");
}

#[test]
fn injected_rank_faults_delay_hang_and_mismatch_as_the_rule_says() {
    // A late rank is waited for.
    let job = job_with_faults(2, 1, Duration::from_secs(20), Some("cc_delay:rank=1:delay=300ms"));
    let started = Instant::now();
    for output in run_all_reduce(&job, 1, 8, 1, None) {
        assert_eq!(output.expect("a late rank is waited for"), vec![3.0; 8]);
    }
    assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());

    // A rank that never arrives is named by the other at the timeout.
    let timeout = Duration::from_secs(1);
    let job = job_with_faults(2, 1, timeout, Some("cc_hang:rank=1"));
    let started = Instant::now();
    let outputs = run_all_reduce(&job, 1, 8, 1, None);
    assert!(started.elapsed() < timeout + Duration::from_secs(2), "{:?}", started.elapsed());
    let errors: Vec<NrtError> = outputs.into_iter().map(|o| o.expect_err("rank 1 hangs")).collect();
    assert!(errors.iter().all(|e| e.status == NrtStatus::ExecHwErrCollectives), "{errors:?}");
    assert!(
        errors[0].message.starts_with("rank 1 (pid") && errors[0].message.contains("never reached"),
        "{}",
        errors[0]
    );
    assert!(errors[1].message.contains("injected by NEURON_RT_FAULT_INJECT rule `cc_hang:rank=1`"), "{}", errors[1]);

    // A rank calling with another count fails the meeting, and both sides are named.
    let job = job_with_faults(2, 1, Duration::from_secs(20), Some("cc_mismatch:rank=0"));
    for output in run_all_reduce(&job, 1, 8, 1, None) {
        let error = output.expect_err("the counts differ");
        assert!(
            error.message.contains("do not match")
                && error.message.contains("36 bytes in")
                && error.message.contains("32 bytes in"),
            "{error}"
        );
    }
}

#[test]
fn each_rank_records_its_rank_on_its_events_and_its_collectives_with_the_communicator_and_the_sequence() {
    use neuron_datastore::{ALL_SYSTEM_EVENTS, DatastoreReader, EventData, EventType, Phase, TailStart, TraceEvent};
    let job = job(2, 1, Duration::from_secs(20));
    let readers: Vec<DatastoreReader> =
        job.iter().map(|f| DatastoreReader::open(&f.runtime.datastore_path().expect("path")).expect("opens")).collect();
    let mut tails: Vec<_> = readers.iter().map(|r| r.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true)).collect();
    for output in run_all_reduce(&job, 1, 8, 3, None) {
        assert_eq!(output.expect("executes"), vec![3.0; 8]);
    }
    let events: Vec<Vec<TraceEvent>> = tails
        .iter_mut()
        .zip(&readers)
        .map(|(tail, reader)| {
            let mut events = Vec::new();
            tail.poll(reader, usize::MAX, false, &mut events);
            events
        })
        .collect();
    // Every execution's events carry the core's rank: the process's, one core each.
    for (process, events) in events.iter().enumerate() {
        let executions: Vec<Option<u32>> = events
            .iter()
            .filter_map(|e| match e {
                TraceEvent::System(e) if e.event_type == EventType::NrtExecute => Some(e.rank),
                _ => None,
            })
            .collect();
        assert_eq!(executions, vec![Some(process as u32); 6], "process {process}: three executions' starts and stops");
    }
    // (rank, sequence, communicator) of every stop, per process.
    let stops: Vec<Vec<(u32, u32, u32)>> = events
        .iter()
        .map(|events| {
            events
                .iter()
                .filter_map(|e| match e {
                    TraceEvent::System(e) if e.event_type == EventType::CcRunning && e.phase == Phase::Stop => {
                        match &e.data {
                            EventData::Collective { rank, sequence, communicator, .. } => {
                                Some((*rank, *sequence, *communicator))
                            }
                            other => panic!("cc_running carries collective data: {other:?}"),
                        }
                    }
                    _ => None,
                })
                .collect()
        })
        .collect();
    let communicator = stops[0][0].2;
    for (process, stops) in stops.iter().enumerate() {
        let expected: Vec<(u32, u32, u32)> = (0..3).map(|s| (process as u32, s, communicator)).collect();
        assert_eq!(stops, &expected, "process {process}: its rank, executions 0 to 2, one communicator id in both");
    }
}

/// Every system event `runtime`'s datastore holds, oldest first.
fn system_events(runtime: &neuron_runtime::Runtime) -> Vec<neuron_datastore::SystemEvent> {
    use neuron_datastore::{ALL_SYSTEM_EVENTS, DatastoreReader, TailStart, TraceEvent};
    let reader = DatastoreReader::open(&runtime.datastore_path().expect("path")).expect("opens");
    let mut tail = reader.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true);
    let mut events = Vec::new();
    tail.poll(&reader, usize::MAX, false, &mut events);
    events
        .into_iter()
        .filter_map(|e| match e {
            TraceEvent::System(e) => Some(e),
            _ => None,
        })
        .collect()
}

/// Waits (up to 10 s) until `runtime` has measured its clock against the root's.
fn measured_offset(runtime: &neuron_runtime::Runtime) -> neuron_runtime::ClockOffset {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(offset) = runtime.clock_offset() {
            return offset;
        }
        assert!(Instant::now() < deadline, "no clock offset within 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn every_process_measures_its_clock_against_the_roots_and_records_it_in_its_trace() {
    use neuron_datastore::EventData;
    let job = job(2, 1, Duration::from_secs(20));
    let comms: Vec<Communicator> =
        (0..2).map(|r| job[r].runtime.join_communicator("clock", 0, r as u32, 2).expect("joins")).collect();
    for comm in &comms {
        comm.wait_for_ranks(Instant::now() + Duration::from_secs(10)).expect("every rank joins");
    }
    for fixture in &job {
        let offset = measured_offset(&fixture.runtime);
        // One host, one clock: the true offset is 0.
        assert!(offset.offset_ns.unsigned_abs() <= offset.uncertainty_ns, "{offset:?}");
        let recorded: Vec<(i64, u64)> = system_events(&fixture.runtime)
            .iter()
            .filter_map(|e| match e.data {
                EventData::ClockOffset { offset_ns, uncertainty_ns } => Some((offset_ns, uncertainty_ns)),
                _ => None,
            })
            .collect();
        assert_eq!(recorded.last(), Some(&(offset.offset_ns, offset.uncertainty_ns)), "{recorded:?}");
    }
}

/// Rank 1 of a job whose root is at `NEURON_VIRT_TEST_CLOCK_ROOT`, in a process of its
/// own: prints the clock offset it measures (run by the test below, with its clock
/// shifted; does nothing when run alone).
#[test]
#[ignore = "the child process of a_process_whose_clock_is_shifted_measures_the_shift_within_its_uncertainty"]
fn child_rank_that_prints_its_clock_offset() {
    let Ok(root) = std::env::var("NEURON_VIRT_TEST_CLOCK_ROOT") else { return };
    let port = root.parse().expect("a port");
    let fixture = common::started(CoreSet::range(0, 0), |config| {
        config.root_comm = Some(RootComm { host: "127.0.0.1".into(), port, from: "NEURON_RT_ROOT_COMM_ID" });
        config.exec_timeout = Duration::from_secs(20);
    });
    let comm = fixture.runtime.join_communicator("shifted", 0, 1, 2).expect("joins");
    comm.wait_for_ranks(Instant::now() + Duration::from_secs(10)).expect("every rank joins");
    let offset = measured_offset(&fixture.runtime);
    println!("clock offset {} ± {} ns", offset.offset_ns, offset.uncertainty_ns);
}

#[test]
fn a_process_whose_clock_is_shifted_measures_the_shift_within_its_uncertainty() {
    const SHIFT_NS: i64 = 7_000_000_000;
    let root = free_root();
    let port = root.port;
    let fixture = common::started(CoreSet::range(0, 0), |config| {
        config.root_comm = Some(root);
        config.exec_timeout = Duration::from_secs(20);
    });
    let comm = fixture.runtime.join_communicator("shifted", 0, 0, 2).expect("joins");
    let child = std::process::Command::new(std::env::current_exe().expect("this test"))
        .args(["--ignored", "--exact", "child_rank_that_prints_its_clock_offset", "--nocapture"])
        .env("NEURON_VIRT_TEST_CLOCK_ROOT", port.to_string())
        .env(neuron_datastore::clock::ENV_TEST_CLOCK_SHIFT_NS, SHIFT_NS.to_string())
        .output()
        .expect("runs the child");
    let out = String::from_utf8_lossy(&child.stdout);
    assert!(child.status.success(), "{out}{}", String::from_utf8_lossy(&child.stderr));
    let line = out.lines().find_map(|l| l.strip_prefix("clock offset ")).expect("the child's offset");
    let (offset, uncertainty) = line.trim_end_matches(" ns").split_once(" ± ").expect("offset ± uncertainty");
    let (offset, uncertainty): (i64, u64) = (offset.parse().expect("ns"), uncertainty.parse().expect("ns"));
    // The child's clock is ahead by the shift: the root's minus the child's is minus it.
    assert!((offset + SHIFT_NS).unsigned_abs() <= uncertainty, "{offset} ± {uncertainty} ns");
    comm.wait_for_ranks(Instant::now() + Duration::from_secs(10)).expect("every rank joined");
    // This process's own clock is the root's.
    let own = measured_offset(&fixture.runtime);
    assert!(own.offset_ns.unsigned_abs() <= own.uncertainty_ns, "{own:?}");
}

#[test]
fn a_collective_that_waits_long_for_a_rank_says_so_once_and_its_timeout_says_the_same() {
    use neuron_datastore::EventData;
    // A timeout of 2 s: the waiting rank says so after 1 s.
    let timeout = Duration::from_secs(2);
    assert_eq!(neuron_runtime::collectives::report_after(timeout), Duration::from_secs(1));
    let job = job(2, 1, timeout);
    let comms: Vec<Communicator> =
        (0..2).map(|r| job[r].runtime.join_communicator("waits", 0, r as u32, 2).expect("joins")).collect();
    comms[0].wait_for_ranks(Instant::now() + Duration::from_secs(10)).expect("every rank joins");
    let rt = &job[0].runtime;
    let x = rt.allocate_tensor(TensorPlacement::Device { core: 0 }, 16, "x").expect("alloc");
    let sum = CollectiveCall::new(Collective::AllReduce(neuron_runtime::isa::ReduceOp::Add), DType::F32);
    // Rank 1 never calls.
    let error = comms[0].run(0, &sum, Some(&x), Some(&x)).expect_err("rank 1 never arrives");
    assert_eq!(error.status, NrtStatus::ExecHwErrCollectives, "{error}");
    // The rank it waited for first, then where.
    assert!(
        error.message.starts_with("rank 1 (pid")
            && error
                .message
                .contains(" never reached all-reduce #0 of comm `waits` (2 ranks): no word from it within 2.000 s; "),
        "{error}"
    );
    let waiting: Vec<(u32, u32, u64)> = system_events(rt)
        .iter()
        .filter_map(|e| match e.data {
            EventData::CcWaiting { peer, rank, waited_ns, .. } => Some((peer, rank, waited_ns)),
            _ => None,
        })
        .collect();
    assert_eq!(waiting.len(), 1, "said once: {waiting:?}");
    let (peer, rank, waited_ns) = waiting[0];
    assert_eq!((peer, rank), (1, 0));
    assert!(waited_ns >= 1_000_000_000, "said after the second it waits: {waited_ns} ns");
}
