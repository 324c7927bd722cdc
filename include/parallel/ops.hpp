#pragma once
// The ops layer: every numerical kernel the model needs, as plain functions on tensors.
//
// Each op dispatches on the device of its tensors (all arguments on one device): the CPU kernels
// live in kernels/cpu/, the CUDA ones in kernels/cuda/ (same contract, same tolerances). Layers
// call only these functions, so a backend plugs in here and nowhere else.
//
// Conventions, shared by every op:
// - Activations are [s, b, h] (sequence first, as Megatron), row-major, contiguous. "rows" means
//   the product of all dimensions but the last.
// - Outputs are written, never allocated: the caller owns memory (so pipeline micro-batches and
//   recomputation control their own lifetimes). Arguments named d* with "accumulate" in their
//   description are parameter gradients: the op ADDS into them (+=), as gradient accumulation over
//   micro-batches needs.
// - Precision (the contract every op states and checks): activations and activation gradients -
//   the tensors that flow between ops - may be fp32, bf16 or fp16 ("floating"); all of one op's
//   activation arguments share one dtype, its *activation dtype*, and its outputs of that kind are
//   written in it. Every op computes in fp32 inside (norm statistics, softmax, GeLU/SwiGLU,
//   cross-entropy, attention's online softmax, GEMM accumulation) and rounds to nearest even when
//   it writes a 16-bit output. Per-row statistics (mean, rstd, lse, row_max, sum_exp, target
//   logits, per-token losses) are always fp32. Parameter *values* are fp32 or the activation dtype
//   (the model's 16-bit copy of the optimizer's fp32 main weights); parameter *gradients* are fp32
//   (accumulated in fp32, Megatron's gradient-accumulation fusion). Anything else is rejected with
//   an error naming the op, the argument and the dtypes. Which dtype each tensor has is decided in
//   one place, the model's precision policy (precision.hpp), not by the ops.
// - Stream: ordering on CUDA; ignored on the CPU. CPU kernels use OpenMP threads (OMP_NUM_THREADS).
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/attention_mask.hpp"
#include "parallel/rope.hpp"
#include "parallel/tensor.hpp"

namespace parallel::ops {

// ---- dense algebra ----------------------------------------------------------------------------

// c = alpha * op(a) @ op(b) + beta * c, row-major 2-D; op(x) = x^T when trans_x.
// op(a): [M, K], op(b): [K, N], c: [M, N]. beta = 1 accumulates (weight gradients).
// A linear layer y = x W^T with W [out, in] is gemm(x, false, W, true, y); its input gradient is
// gemm(dy, false, W, false, dx) and its weight gradient gemm(dy, true, x, false, dW, 1, 1).
//
// Dtypes: a and b share one floating dtype; c is fp32 or that dtype. With 16-bit a and b the
// products accumulate in fp32 (oneDNN's bf16 matmul on the CPU: AMX or AVX512-BF16 where the CPU
// has them, a widening fallback elsewhere; tensor cores on CUDA) and c is rounded once at the end
// when it is 16-bit. beta != 0 reads c in its own dtype (fp32 weight gradients accumulate exactly
// as in an fp32 run).
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha = 1.0f,
          float beta = 0.0f, Stream stream = {});

// c = op(a) @ op(b) + bias (bias [N], broadcast over the rows; fp32 or a's dtype): the linear
// layer's forward with the bias added to the fp32 accumulator, so a 16-bit c is rounded once.
void gemm_bias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias, Tensor& c,
               Stream stream = {});

// Packed weights. While a scope is open, a CPU gemm / gemm_bias whose 16-bit b lies inside one of
// the scope's buffers uses b in the kernel's own packed layout (fp32 b is used as it is: measured
// faster), made at b's first use and reused by
// every later call on the same b (each orientation packs once: x W^T forward, dy W backward), so
// the micro-batches of a step share one packing of every weight. The packed copies come from the
// library allocator and are freed when the scope closes. The opener promises that nothing writes
// the buffers while the scope is open (the trainer opens one around a step's micro-batches; the
// optimizer writes the weights after it closes). One scope at a time; no effect on CUDA tensors.
class WeightPackingScope {
 public:
  explicit WeightPackingScope(const std::vector<Tensor>& buffers);
  ~WeightPackingScope();
  WeightPackingScope(const WeightPackingScope&) = delete;
  WeightPackingScope& operator=(const WeightPackingScope&) = delete;
  // Weights packed since the process started (each pack is one reorder), for tests and logs.
  static int64_t packs_made();
  // Whether the trainer opens scopes: yes unless the environment sets PARALLEL_PACK_WEIGHTS=0
  // (for side-by-side measurements).
  static bool enabled();
  // Whether an open scope packs weights of this dtype on this machine: 16-bit, with a oneDNN kernel
  // for it (fp16 has none on CPUs without AVX512-FP16 or AMX-FP16: gemm widens, nothing is packed).
  static bool packs(DType dtype);
};

// Which kernel the CPU GEMM runs for operands of `dtype` on this machine: oneDNN's implementation
// name and the ISA it dispatches to (e.g. "brg:avx512_core_bf16 (isa avx512_core_bf16)"), or the
// widening fallback. For logs and benchmarks.
std::string gemm_implementation(DType dtype);

// y[r, :] += bias for every row r.
void add_bias(Tensor& y, const Tensor& bias, Stream stream = {});
// dbias += sum over rows of dy (accumulate).
void bias_backward(const Tensor& dy, Tensor& dbias, Stream stream = {});

// ---- element-wise -----------------------------------------------------------------------------

void add(const Tensor& a, const Tensor& b, Tensor& out, Stream stream = {});  // out may alias a or b
void add_(Tensor& a, const Tensor& b, Stream stream = {});                    // a += b
void scale_(Tensor& a, float alpha, Stream stream = {});                      // a *= alpha

// Rounds every element of the fp32 tensor x in place to the nearest value of `precision` (BF16 or
// F16; round to nearest, ties to even, exactly as float_to_bf16 / float_to_f16 followed by the
// widening back: NaN stays a quiet NaN, fp16 overflow becomes inf, fp16 subnormals are kept). F32 is
// a no-op. For fp32 tensors that must hold 16-bit values (references in tests); the model itself
// holds real 16-bit tensors (precision.hpp) and never calls it.
void round_to_precision_(Tensor& x, DType precision, Stream stream = {});

// GeLU with the tanh approximation (GPT-2's): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(const Tensor& x, Tensor& y, Stream stream = {});
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream stream = {});
// gelu_backward, and dbias (fp32 [f], x [..., f]) += the column sums of dx, as bias_backward(dx,
// dbias) would add them: one pass, dx written and summed while it is in cache (the MLP's first bias
// gradient). Bitwise the two ops one after the other on the CPU.
void gelu_backward_bias(const Tensor& dy, const Tensor& x, Tensor& dx, Tensor& dbias, Stream stream = {});

// SwiGLU on x = [..., 2f] split in halves (gate = x[..., :f], up = x[..., f:]): y = silu(gate) * up,
// y = [..., f]. Under tensor parallelism each rank holds its own [gate_r | up_r] halves.
void swiglu_forward(const Tensor& x, Tensor& y, Stream stream = {});
void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream stream = {});

// Inverted dropout with a counter-based RNG: element i is kept iff uniform(seed, offset + i) >= p,
// kept values scaled by 1/(1-p). The same (seed, offset + i) gives the same decision on any rank,
// so masks do not depend on how a tensor is split. p == 0 copies.
void dropout_forward(const Tensor& x, Tensor& y, float p, uint64_t seed, uint64_t offset, Stream stream = {});
void dropout_backward(const Tensor& dy, Tensor& dx, float p, uint64_t seed, uint64_t offset,
                      Stream stream = {});

// ---- normalisation ----------------------------------------------------------------------------

// Over the last dimension h: y = (x - mean) * rstd * weight + bias. mean, rstd: [rows] (saved for
// the backward). dweight, dbias: accumulate.
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                       Tensor& rstd, float eps, Stream stream = {});
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias, Stream stream = {});
// y = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps). dweight: accumulate.
void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
                     Stream stream = {});
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, Tensor& dx,
                      Tensor& dweight, Stream stream = {});

// ---- residual add fused with its neighbours ----------------------------------------------------
//
// A pre-norm layer spends its element-wise time around the residual stream:
//     x2 = x + dropout(attention(...));  m = norm2(x2);  ...;  out = x2 + dropout(mlp(...))
// and, backward, norm gradients plus the residual gradient, then dropout's backward. These ops do
// each such group in one pass over the rows (one OpenMP region), reading every 16-bit tensor once.
// Numerics are the unfused ops' except that intermediates stay fp32 inside the pass (the dropped
// branch before its add, the norm gradient before the residual's is added), so 16-bit results
// differ from the unfused chain by at most one rounding; fp32 results may differ in the last bit
// where the compiler contracts x + b * scale into an FMA.
//
// On CUDA they run as the unfused ops in sequence (no fused CUDA kernel yet).

// Dropout applied inside a fused op: the keep decisions and scale are exactly those of
// dropout_forward(branch, ..., p, seed, offset). p == 0: no dropout.
struct DropoutSpec {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// sum = residual + dropout(branch); y = norm(sum) over the last dimension h.
// LayerNorm when `bias` is defined (mean written), RMSNorm when bias and mean are undefined.
// sum is stored in the activation dtype and y normalises the STORED sum, so a backward that reads
// sum differentiates exactly the function the forward computed. sum may alias residual or branch.
void residual_norm_forward(const Tensor& residual, const Tensor& branch, const DropoutSpec& drop,
                           const Tensor& weight, const Tensor& bias, Tensor& sum, Tensor& y, Tensor& mean,
                           Tensor& rstd, float eps, Stream stream = {});
// The norm's backward with the residual path's gradient added in the same pass:
//   dx = norm_backward(dy; x, weight, mean, rstd) + dresidual;   dbranch = dropout_backward(dx)
// (LayerNorm when mean and dbias are defined, RMSNorm when both are undefined; dweight and dbias
// accumulate). dbranch is written only when defined: with p == 0 the caller uses dx itself.
// dx may alias dresidual.
void norm_backward_residual(const Tensor& dy, const Tensor& dresidual, const Tensor& x, const Tensor& weight,
                            const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                            Tensor& dbias, const DropoutSpec& drop, Tensor& dbranch, Stream stream = {});
// out = residual + dropout(branch), one pass. out may alias branch or residual.
void dropout_add(const Tensor& branch, const Tensor& residual, Tensor& out, const DropoutSpec& drop,
                 Stream stream = {});

// ---- attention --------------------------------------------------------------------------------

// Rotary embedding in place on x = [s, b, heads, d] (d even), rotating pairs (i, i + d/2) as
// GPT-NeoX / Llama do, at positions position_offset + s_index, frequencies rope_inv_freq(rope, i, d)
// (theta^(-2i/d), scaled as rope.scaling says: parallel/rope.hpp; a plain theta is unscaled).
// The backward is the rotation by the negative angle, applied in place to the gradient.
void rope_forward(Tensor& x, int64_t position_offset, const Rope& rope, Stream stream = {});
void rope_backward(Tensor& dx, int64_t position_offset, const Rope& rope, Stream stream = {});

// Scaled dot-product attention, tiled with an online softmax (FlashAttention's algorithm): no
// [s, s] matrix is ever materialised. q: [s, b, hq, d]; k: [s, b, hkv, d]; v: [s, b, hkv, dv] with
// hq % hkv == 0 (grouped-query attention: query head i uses kv head i / (hq / hkv)); out:
// [s, b, hq, dv]; lse: [b, hq, s] fp32, the log-sum-exp of each query row's scaled scores, saved
// for the backward. The value head size dv may differ from the query/key head size d (multi-head
// latent attention: d = 192, dv = 128 in DeepSeek-V3); it is read from v, so a caller with equal
// sizes passes nothing new. softmax_scale is the caller's (usually 1/sqrt(d); MLA under YaRN
// multiplies it by mscale^2), never derived from a head size here.
//
// Strides: on the CPU (and meta), q, k, v, dq, dk and dv need only each position's heads side by
// side (strides [.., .., head size, 1]); their position and batch strides are free, so they may be views
// into the fused qkv projection's output [s, b, (hq + 2 hkv) d] and its gradient (the layer passes
// them so, with no copy). out, dout and lse are contiguous, and on CUDA every tensor is.
//
// Dtypes: q, k, v, out (and dout, dq, dk, dv) share the activation dtype; lse is fp32. The scores,
// the online softmax and every accumulator are fp32. bf16 on a CPU with AVX512-BF16, and 16-bit
// inputs on CUDA's tensor-core kernels (head dims 64 and 128), both for d == dv only, multiply
// 16-bit operands and round the probabilities and dS to 16 bits before their products, as
// FlashAttention does; elsewhere 16-bit inputs are widened and computed in fp32
// (attention_implementation says which, for d == dv).
//
// The mask (attention_mask.hpp has the rule): causal, a sliding window, documents (doc_start) and
// the positions of the first query and key row (context parallelism's blocks). Every query row
// sees one contiguous range of keys, and the kernels skip every tile outside it, so a packed
// sequence costs the sum of its documents' squared lengths and a window is linear in s. A row that
// sees no key (a block of context parallelism) gets a zero output and lse = -inf.
struct AttentionMask {
  bool causal = true;
  int64_t window = 0;  // > 0: a query sees itself and the window - 1 keys before it
  int64_t q_pos0 = 0;  // position of q's row 0
  int64_t k_pos0 = 0;  // position of k's row 0
  // int32 [b, S] on q's device, or undefined: the position where the document of the token at
  // position p starts (S covers every position of q and k: the whole sequence). Its values are
  // not checked (device memory); a start past p leaves that row with no key.
  Tensor doc_start;
  static AttentionMask plain(bool causal) {
    AttentionMask m;
    m.causal = causal;
    return m;
  }
  bool has_documents() const { return doc_start.defined(); }
};
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionMask& mask, float softmax_scale, Stream stream = {});
inline void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                              bool causal, float softmax_scale, Stream stream = {}) {
  attention_forward(q, k, v, out, lse, AttentionMask::plain(causal), softmax_scale, stream);
}
// dq [s, b, hq, d], dk [s, b, hkv, d], dv [s, b, hkv, dv] are written (not accumulated); dk, dv sum
// over the query heads that share them. dout and out are [s, b, hq, dv].
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionMask& mask, float softmax_scale, Stream stream = {});
inline void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                               bool causal, float softmax_scale, Stream stream = {}) {
  attention_backward(dout, q, k, v, out, lse, dq, dk, dv, AttentionMask::plain(causal), softmax_scale,
                     stream);
}
// Number of (query, key) pairs that causal and the window leave visible in a call of sq query rows
// against sk keys, per batch element and head: what the meta device counts FLOPs over. Documents
// are not counted: their boundaries are values, which a meta tensor has none of, so the count
// assumes one document per sequence (an upper bound on the work of a packed sequence).
double attention_visible_pairs(const AttentionMask& mask, int64_t sq, int64_t sk);
// Merges one block's partial attention into a running result, as ring attention (context
// parallelism) combines the blocks of keys it sees one after another. out_acc [S, b, h, d] and
// lse_acc [b, h, S] are fp32 accumulators; out_blk [n, b, h, d] (any activation dtype, read as
// stored) and lse_blk [b, h, n] (fp32) are attention_forward's results for query rows
// [q0, q0 + n) of the accumulators against one block of keys. For each of those rows:
//   lse = log(e^lse_acc + e^lse_blk),  out_acc = e^(lse_acc - lse) out_acc + e^(lse_blk - lse) out_blk
// in fp32 (the log-sum-exp with its maximum subtracted). -inf marks a row that has seen no key:
// lse_acc starts at -inf (out_acc then must hold finite values, e.g. zeros: it is weighted by 0);
// a row whose lse_blk is -inf (every key of the block masked) is left unchanged; a row whose
// lse_acc is -inf takes the block's values and lse. Requires 0 <= q0 and q0 + n <= S.
void attention_merge(Tensor& out_acc, Tensor& lse_acc, const Tensor& out_blk, const Tensor& lse_blk,
                     int64_t q0, Stream stream = {});
// Which CPU attention kernel runs for `dtype` with head dim `head_dim` on this machine: "fp32",
// "bf16 on avx512_bf16 dot products" or "widened to fp32". For logs and benchmarks.
std::string attention_implementation(DType dtype, int64_t head_dim);
// Bytes one CPU attention call (forward, or backward) allocates besides its outputs, on this
// machine's kernel and OpenMP thread count, for self-attention over s tokens: per-thread tiles,
// packed operands, the backward's row sums, and the fp32 copies where 16-bit inputs are widened.
// v_head_dim: the value head size (0: head_dim). The memory plan counts this.
int64_t attention_workspace_bytes(DType dtype, int64_t s, int64_t b, int64_t hq, int64_t hkv,
                                  int64_t head_dim, bool backward, int64_t v_head_dim = 0);

// ---- embedding and loss -----------------------------------------------------------------------

// tokens: [b, s] int32 (global vocabulary ids); weight: [rows, h] holding ids [vocab_start,
// vocab_start + rows); out: [s, b, h]. Ids outside this rank's range give zero rows (the
// vocab-parallel all-reduce adds the owner's row).
void embedding_forward(const Tensor& tokens, const Tensor& weight, int64_t vocab_start, Tensor& out,
                       Stream stream = {});
// dweight[id - vocab_start] += dout[s, b] for ids in range (accumulate).
void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dweight,
                        Stream stream = {});

// The three local pieces of vocab-parallel cross-entropy over logits [n, v_local] whose column j is
// global id vocab_start + j; columns with global id >= vocab_size (padding) are ignored.
//   row_max[n]      = max over valid local columns (-inf if none)
//   target_logit[n] = logits[i, target - vocab_start] if this rank owns target[i], else 0
// After the caller all-reduces row_max (max) it calls cross_entropy_sum_exp:
//   sum_exp[n] = sum over valid local columns of exp(logits - row_max)
// targets: [n] int32.
void cross_entropy_local_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                               int64_t vocab_size, Tensor& row_max, Tensor& target_logit, Stream stream = {});
void cross_entropy_sum_exp(const Tensor& logits, const Tensor& row_max, int64_t vocab_start,
                           int64_t vocab_size, Tensor& sum_exp, Stream stream = {});
// Both pieces at once where no reduction sits between them (the logits' vocabulary on one rank):
// row_max, target_logit, then sum_exp against that row_max, each row's max and sum taken while the
// row is in cache (the logits are read from memory once instead of twice). Bitwise the two calls.
void cross_entropy_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t vocab_size,
                         Tensor& row_max, Tensor& target_logit, Tensor& sum_exp, Stream stream = {});
// dlogits[i, j] = grad_scale[i] * (softmax_ij - [j is target_i]); padding columns get 0.
// softmax_ij = exp(logits_ij - row_max_i) / sum_exp_i with the all-reduced row_max and sum_exp.
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                            const Tensor& sum_exp, const Tensor& grad_scale, int64_t vocab_start,
                            int64_t vocab_size, Tensor& dlogits, Stream stream = {});

// loss[i] = log(sum_exp[i]) + row_max[i] - target_logit[i]: the per-token loss from the
// all-reduced pieces, formed on their device (all fp32 [n]) so the host reads nothing per
// micro-batch.
void cross_entropy_loss(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                        Tensor& loss, Stream stream = {});

// ---- rows by index (mixture of experts) ---------------------------------------------------------
//
// The passes over activation rows of a MoE layer (token permutation, dispatch buffers, the weighted
// combine and its backward) as gathers: every output row is written by one thread from the rows its
// index names, so there is no scatter and no float atomic, and each sum runs in a fixed order (the
// index's). Indices are int64 on the tensors' device; a negative index stands for a zero row (the
// padding of a dispatch buffer, a dropped assignment); the others must be < the source's rows.

// out[i] = src[index[i]] (the stored bits), or a zero row where index[i] < 0. src [R, h] and
// out [n, h] share one floating dtype; index [n].
void gather_rows(const Tensor& src, const Tensor& index, Tensor& out, Stream stream = {});
// out[i] = scale[i] * src[index[i]], the product in fp32 and rounded once to out's dtype (zero where
// index[i] < 0). scale [n] fp32; src and out share one floating dtype. (The combine's backward:
// d(expert output) = combine weight * dy of the row's token.)
void gather_rows_scaled(const Tensor& src, const Tensor& index, const Tensor& scale, Tensor& out,
                        Stream stream = {});
// out[t] = sum over j of weight[t, j] * src[index[t, j]], skipping index[t, j] < 0: accumulated in
// fp32 from zero in the order j = 0, 1, ..., and written once in out's dtype (fp32 or src's).
// index and weight [T, k]; weight fp32, or undefined for all ones (a plain sum, each row added as
// is). src [N, h], out [T, h]. (The combine: each token sums its experts' outputs weighted by the
// router probabilities; unpermuting an input gradient: each token sums its assignments' rows.)
void gather_sum_rows(const Tensor& src, const Tensor& index, const Tensor& weight, Tensor& out,
                     Stream stream = {});
// out[i] = <a[i], b[index[i]]> over h, the products and the sum in double, rounded once to fp32.
// a [n, h] and b [m, h] share one floating dtype; index [n] (>= 0); out [n] fp32. (The gradient
// of a combine weight: <dy of the token, the expert's output row>.)
void row_dot(const Tensor& a, const Tensor& b, const Tensor& index, Tensor& out, Stream stream = {});

// ---- reductions -------------------------------------------------------------------------------

// Sum of squares of all elements, accumulated in double. Returns a host value: one host read
// (host_reads() counts it); prefer sum_of_squares_accumulate on the training path.
double sum_of_squares(const Tensor& x, Stream stream = {});
// acc[0] += sum of squares of x (x fp32, acc an fp32 [1] tensor on x's device; each tensor's sum is
// formed in double): the global gradient norm without a host read per tensor.
void sum_of_squares_accumulate(const Tensor& x, Tensor& acc, Stream stream = {});
// x /= max(||x||_F, eps) in place (x fp32): the Frobenius norm's sum formed in double, rounded to
// float, then each element divided by it (torch's x.div_(x.norm().clamp(min=eps))). Muon's
// Newton-Schulz starts from it; no host read, so it runs on a GPU without a sync and on meta.
void normalize_(Tensor& x, float eps, Stream stream = {});
// acc[0] += sum of squares of xs[0], then of xs[1], ... (each fp32, on acc's device): bitwise the
// sequence of sum_of_squares_accumulate calls over xs in order, in one pass over all of them (on
// the CPU one OpenMP region for the list instead of one per tensor; each tensor is still split
// over the threads exactly as sum_of_squares_accumulate splits it, so every partial sum is the
// same). The global gradient norm's sum over every parameter.
void sum_of_squares_accumulate_multi(const std::vector<Tensor>& xs, Tensor& acc, Stream stream = {});

// ---- optimizer --------------------------------------------------------------------------------

// One AdamW update of fp32 param, exp_avg, exp_avg_sq (in place, all [n]) from grad [n], with
// torch.optim.AdamW's single-tensor arithmetic operation for operation (t = step, from 1):
//   g = grad * grad_scale (skipped when 1); p *= 1 - lr wd;
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// The scalars are computed once in double and rounded to float, the same on every device, so the
// CPU and CUDA kernels perform the same float operations per element.
struct AdamWStep {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;
  float grad_scale = 1.0f;  // the clip coefficient
};
void adamw_update_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWStep& h,
                   Stream stream = {});
// The same update of the fp32 main weights `param`, also writing model_copy (bf16/fp16, [n]) =
// param rounded to nearest even in the same pass: the mixed-precision write-back of the model's
// 16-bit parameters, without a second pass over the main weights.
void adamw_update_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, Tensor& model_copy,
                   const AdamWStep& h, Stream stream = {});

// One tensor of a multi-tensor update: the arguments of adamw_update_ (model_copy undefined: the
// fp32 overload) and the tensor's own weight decay (AdamWStep::weight_decay is not used).
struct AdamWTensors {
  Tensor param, grad, exp_avg, exp_avg_sq;
  Tensor model_copy;
  double weight_decay = 0.0;
};
// adamw_update_ of every entry with h (weight decay per entry), in one pass over all of them, as
// torch's _foreach / multi_tensor_apply: on the CPU one OpenMP region whose threads share every
// tensor's blocks, instead of one region per tensor. Each element's update is independent of the
// others, so every result is bitwise that of the per-tensor calls.
void adamw_update_multi_(const std::vector<AdamWTensors>& tensors, const AdamWStep& h, Stream stream = {});

}  // namespace parallel::ops
