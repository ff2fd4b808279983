// Greedy decoding with a KV cache on decoder models in the Hugging Face Optimum layout
// (input_ids, attention_mask, position_ids, past_key_values.* -> logits, present.*), whether built
// by graph-autofusion or exported by other tools.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cost/workload.h"
#include "runtime/session.h"

namespace gaf {

// Where a decoder's inputs and outputs are, discovered from their names.
struct DecoderSignature {
  std::string input_ids;
  std::string attention_mask;  // "" when the model has none
  std::string position_ids;    // "" when the model has none
  std::string use_cache_branch;  // Optimum's merged decoders: a bool [1] input ("" when absent)
  std::string logits;
  // Cache entries: past input name -> present output name, in input order.
  std::vector<std::pair<std::string, std::string>> cache;

  // Finds the names in a model's inputs and outputs; throws gaf::Error naming what is missing.
  // Past inputs: past_key_values.{i}.key|value, past_key_values.{i}, past.{i}.key, ...; each is
  // paired with the output that has the same layer index and key/value kind and whose name
  // contains "present".
  static DecoderSignature Discover(const std::vector<ValueInfo>& inputs, const std::vector<ValueInfo>& outputs);
};

struct GenerateOptions {
  std::vector<int64_t> prompt_ids;  // must not be empty
  int max_new_tokens = 50;          // tokens produced (the first comes from the prefill)
  int64_t eos_token_id = -1;        // stop after producing it; -1: never stop early
  std::function<void()> after_prefill;  // called after the prefill, outside the timings (may be empty)
  std::function<void()> after_first_step;  // called after the first decode step, outside the timings (may be empty)
};

struct GenerateResult {
  std::vector<int64_t> tokens;  // the new tokens, in order
  double prefill_seconds = 0;   // the prompt's forward pass (including its argmax)
  std::vector<double> step_seconds;  // each decode step (one token fed, one produced)

  double MedianStepSeconds() const;  // 0 when there were no decode steps
  // Decoded tokens per second, from the median step time (0 without decode steps).
  double DecodeTokensPerSecond() const;
};

// A generation the caller drives one step at a time (its own sampling or stopping rule): each Step
// runs the given tokens after those of the steps before it and returns the model's logits. The
// key/value caches stay inside: each run's present tensors are the next run's past, handed over as
// they are, and where the attention is one node the new rows are appended in place (Session::Run's
// cache_room), as Generate does. Batch size 1. A step that fails (a bad token id, the memory limit)
// leaves the loop empty again (past length 0).
class DecodeLoop {
 public:
  explicit DecodeLoop(Session& session);
  DecodeLoop(Session& session, DecoderSignature sig);
  // Runs `ids` (not empty) at positions past_length().. and returns the logits output as the model
  // makes it ([1, ids.size(), vocab] or [1, vocab]); past_length() grows by ids.size().
  Tensor Step(const std::vector<int64_t>& ids);
  int64_t past_length() const { return past_len_; }
  // Steps return the logits of the last position only ([1, 1, vocab]) where the plan can compute
  // just that (Session::Run's last_position_only): a prompt's step then skips the vocabulary head
  // on every other position. Off by default (Step returns every position's logits).
  void set_last_position_only(bool on) { last_position_only_ = on; }
  // Forgets the cache: the next Step starts a new sequence.
  void Reset();

 private:
  Session& session_;
  DecoderSignature sig_;
  std::vector<std::string> output_names_;
  std::map<std::string, Tensor> feeds_;
  std::vector<Tensor> presents_;
  int64_t past_len_ = 0;
  bool last_position_only_ = false;
};

// The logits of the last position for batch row 0 ([vocab], float32) of logits [batch, seq, vocab]
// or [batch, vocab].
Tensor LastPositionLogits(const Tensor& logits);

// Greedy generation: one prefill run over the prompt with an empty cache (past length 0), then one
// run per new token, feeding the previous run's present tensors as the next past (the buffers are
// handed over as they are, no copy): a DecodeLoop stepped with the argmax. Batch size 1.
GenerateResult Generate(Session& session, const GenerateOptions& options);
GenerateResult Generate(Session& session, const DecoderSignature& sig, const GenerateOptions& options);

// Argmax over the last position of logits [batch, seq, vocab] (or [batch, vocab]) for batch row 0.
int64_t ArgmaxLastPosition(const Tensor& logits);

// One forward pass over `ids` with an empty cache; returns the logits. Used to check the cache
// logic (recompute the whole sequence without cache).
Tensor ForwardNoCache(Session& session, const DecoderSignature& sig, const std::vector<int64_t>& ids);

// Bytes of initializers one decode step (batch 1, one new token) reads, by category: every
// MatMul/Gemm input that is an initializer, in full (`matmul`); for a Gather whose data is an
// initializer, one slice along its axis (the embedding row, the rotary rows: `gather`; so too the
// cos and sin rows a RotaryEmbedding reads at the position ids); every other
// initializer a node reads, in full (`other`; a Gather's constant indices are not counted). An
// initializer read by several nodes counts once per node. The bandwidth floor of a decode step is
// total() / the machine's read bandwidth.
struct DecodeStepBytes {
  int64_t matmul = 0, gather = 0, other = 0;
  int64_t matmul_tensors = 0, gather_tensors = 0, other_tensors = 0;
  int64_t total() const { return matmul + gather + other; }
};
DecodeStepBytes CountDecodeStepBytes(const Graph& graph);

// The vocabulary: the logits output's last declared dim, the model's vocab_size metadata, or the
// size of the embedding table input_ids index; 100 when none says.
int64_t DecoderVocabSize(const Model& model, const DecoderSignature& sig);

// The feeds of a short greedy generation on `model` (the reference session, unfused kernels): the
// prefill of `prompt_len` random tokens (seeded, below the vocabulary) with an empty past, then
// `decode_steps` steps of one token each with the real presents as past. So a workload measured
// on it sees what `generate` runs: prefill and decode shapes, a growing past. Throws gaf::Error
// when the model is not a decoder in the Optimum layout (DecoderSignature::Discover) or a call
// fails (naming the step).
Workload DecoderTraceWorkload(const Model& model, int prompt_len = 8, int decode_steps = 3, uint32_t seed = 0);

// The task-level gate of float16 weight storage (SafeFusionOptions::half_weights_check) on a
// decoder in the Optimum layout: the greedy tokens of a generation from a random prompt (seed 0)
// with float16 weights (HalfWeights::kAll, as `generate` runs them) must be those with float32
// weights, both on `fused`'s reference kernels. Models that are not such decoders pass (the
// precision gate alone decides for them). *what says what was compared, the first token that
// differs, or why the generation failed (then it does not pass).
bool HalfWeightsKeepGreedyTokens(const Model& fused, int threads, std::string* what, int prompt_len = 16,
                                 int new_tokens = 32);

}  // namespace gaf
