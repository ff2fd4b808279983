// GAF_ASAN: 1 in an AddressSanitizer build, GCC's or clang's (clang 14 does not define GCC's
// __SANITIZE_ADDRESS__; it answers __has_feature(address_sanitizer)), else 0.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define GAF_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GAF_ASAN 1
#endif
#endif
#ifndef GAF_ASAN
#define GAF_ASAN 0
#endif
