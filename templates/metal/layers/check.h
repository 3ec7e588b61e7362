// MSL's declarations for qrgen's compile check (qrgen/compile/msl.py): clang parses a rendered Metal source as
// C++14 with MSL's address spaces as clang address spaces, so a pointer passed from one address space to another,
// an unknown function or type, or a wrong argument is an error here as it is for the Metal compiler. Only what
// qrgen's Metal kernels use is declared, with MSL's signatures.
#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define thread
#define kernel __attribute__((annotate("kernel")))
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned long ulong;
struct uint3 { uint x, y, z; };
struct ulong2 { ulong x, y; ulong2(ulong a = 0, ulong b = 0) : x(a), y(b) {} };
namespace metal {
enum class mem_flags : unsigned { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
mem_flags operator|(mem_flags a, mem_flags b);
void threadgroup_barrier(mem_flags flags);
void simdgroup_barrier(mem_flags flags);
float simd_shuffle(float data, ushort simd_lane_id);
float simd_shuffle_xor(float data, ushort mask);
float simd_sum(float data);
float fma(float a, float b, float c);
float sqrt(float x);
float abs(float x);
// half and bfloat (MSL 3.1) as clang's 16-bit floating types
typedef _Float16 half;
typedef __bf16 bfloat;
template <typename T, typename F> T as_type(F x);
template <typename T, int COLS, int ROWS> struct simdgroup_matrix { simdgroup_matrix() = default; };
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;
template <typename T, int COLS, int ROWS> simdgroup_matrix<T, COLS, ROWS> make_filled_simdgroup_matrix(T value);
template <typename T, int COLS, int ROWS>
void simdgroup_load(thread simdgroup_matrix<T, COLS, ROWS>& d, const threadgroup T* src, ulong elements_per_row = COLS,
                    ulong2 matrix_origin = ulong2(0, 0), bool transpose_matrix = false);
template <typename T, int COLS, int ROWS>
void simdgroup_load(thread simdgroup_matrix<T, COLS, ROWS>& d, const device T* src, ulong elements_per_row = COLS,
                    ulong2 matrix_origin = ulong2(0, 0), bool transpose_matrix = false);
template <typename T, int COLS, int ROWS>
void simdgroup_store(thread const simdgroup_matrix<T, COLS, ROWS>& a, threadgroup T* dst,
                     ulong elements_per_row = COLS, ulong2 matrix_origin = ulong2(0, 0), bool transpose_matrix = false);
template <typename T, int COLS, int ROWS>
void simdgroup_store(thread const simdgroup_matrix<T, COLS, ROWS>& a, device T* dst, ulong elements_per_row = COLS,
                     ulong2 matrix_origin = ulong2(0, 0), bool transpose_matrix = false);
// a and b of half or bfloat with float c and d: fp32 accumulation of 16-bit inputs
template <typename T, typename A, typename B, int N>
void simdgroup_multiply_accumulate(thread simdgroup_matrix<T, N, N>& d, thread const simdgroup_matrix<A, N, N>& a,
                                   thread const simdgroup_matrix<B, N, N>& b, thread const simdgroup_matrix<T, N, N>& c);
}  // namespace metal
