// This process's place in the training cluster, parsed from TF_CONFIG by the rules of TensorFlow's
// TFConfigClusterResolver and multi_worker_util (MultiWorkerMirroredStrategy: chief + workers,
// all-reduce; no parameter servers). parse_tf_config() is pure; cluster_from_env()
// (environment.h) reads the environment. ClusterSpec is a plain value; everything here is
// thread-safe.
//
// The rules, in brief:
//   - no TF_CONFIG, an empty one, no `cluster` (or an empty one): one local worker, its own chief;
//   - `cluster` maps task types (chief, master, worker, evaluator) to lists of "host:port";
//     `master` is AI Platform's name for the chief; `ps` is refused;
//   - the chief is the `chief` task, else worker 0; rank: chief 0, worker i -> i + (has chief);
//     world size = chiefs + workers; an `evaluator` is not in the training world (rank -1);
//   - `task` names this process: `type` and `index` (a number or a string of digits, default 0);
//     it may be left out only when the cluster has exactly one task.
// Every malformed document is a ConfigError whose message starts "TF_CONFIG: " and quotes the part
// that is wrong.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trainer::cluster {

struct ClusterSpec {
  std::string task_type = "worker";  // chief | worker | evaluator ("master" is reported as chief)
  int task_index = 0;                // index within task_type's list in TF_CONFIG
  int rank = 0;                      // 0 = chief; -1 for an evaluator (not in the training world)
  int world_size = 1;                // training replicas (chief + workers)
  std::string chief_address;         // host:port of the chief ("" when single-process)
  std::string own_address;  // this task's host:port ("" when single-process, or an evaluator
                            // that the cluster does not list)
  std::vector<std::string> worker_addresses;  // training tasks in rank order, chief first
                                              // (empty when single-process)
  bool has_chief_task = false;                // the cluster has a `chief` (or `master`) task
  int num_workers = 1;  // tasks of type `worker` (world_size = has_chief_task + this)

  // The one rule for who the chief is: the training task of rank 0 (the `chief` task, else
  // worker 0; an evaluator, rank -1, never is). What only the chief writes goes through
  // job's chief_writes() (job/agreement.h); outside cluster/ nothing else asks.
  bool is_chief() const { return rank == 0; }
};

// The ClusterSpec a TF_CONFIG document describes; empty text = single local worker. Pure (logs one
// info line when it takes `master` as the chief). Throws ConfigError ("TF_CONFIG: ...").
ClusterSpec parse_tf_config(const std::string& text);

// The host and the port of a "host:port" or "[ipv6]:port" address ("[::1]:2222" -> "::1", 2222).
// Throws ConfigError naming the address when it is malformed.
std::string host_of(const std::string& address);
int port_of(const std::string& address);

// inspect's `cluster` object.
nlohmann::json to_json(const ClusterSpec& spec);

}  // namespace trainer::cluster

namespace trainer::cluster {

// The TF_CONFIG name of the training task with `rank`: "chief" or "worker <i>".
std::string task_name(const ClusterSpec& spec, int rank);

}  // namespace trainer::cluster
