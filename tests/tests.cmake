# Every tests/test_*.c is a unit test executable; every tests/test_*.sh a CLI test
# (run with the dtrain binary, the source dir and the build dir as arguments).
file(GLOB DT_C_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/test_*.c)
foreach(src ${DT_C_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE dtrain_lib)
  set_target_properties(${name} PROPERTIES BUILD_RPATH ${DT_BLAS_DIR})
  add_test(NAME ${name} COMMAND ${name} ${CMAKE_SOURCE_DIR} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=passive" SKIP_RETURN_CODE 77)
endforeach()
# The tensor-core kernels' own source (src/backend/cuda/flash_attention.cuh) run on host
# threads by tests/warp_sim.h: C++, no CUDA toolkit or GPU needed, so CI checks them too.
enable_language(CXX)
add_executable(test_flash_sim ${CMAKE_SOURCE_DIR}/tests/test_flash_sim.cpp)
set_target_properties(test_flash_sim PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
target_compile_options(test_flash_sim PRIVATE -O2 -Wall -Wextra -Werror -Wno-unknown-pragmas -fno-strict-aliasing
                       $<$<BOOL:${DT_SANITIZE}>:-fsanitize=address,undefined;-fno-omit-frame-pointer;-fno-sanitize-recover=undefined>)
target_link_libraries(test_flash_sim PRIVATE Threads::Threads)
add_test(NAME test_flash_sim COMMAND test_flash_sim)
# The same for the Llama family's kernels (src/backend/cuda/llama_kernels.cuh), against the
# CPU backend's (linked from dtrain_lib: the CPU kernels and the bf16-storage adapter).
add_executable(test_llama_sim ${CMAKE_SOURCE_DIR}/tests/test_llama_sim.cpp)
set_target_properties(test_llama_sim PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON BUILD_RPATH ${DT_BLAS_DIR})
target_compile_options(test_llama_sim PRIVATE -O2 -Wall -Wextra -Werror -Wno-unknown-pragmas -fno-strict-aliasing
                       $<$<BOOL:${DT_SANITIZE}>:-fsanitize=address,undefined;-fno-omit-frame-pointer;-fno-sanitize-recover=undefined>)
target_link_libraries(test_llama_sim PRIVATE dtrain_lib Threads::Threads)
add_test(NAME test_llama_sim COMMAND test_llama_sim)
set_tests_properties(test_llama_sim PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=passive")
file(GLOB DT_SH_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/test_*.sh)
foreach(src ${DT_SH_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_test(NAME ${name} COMMAND bash ${src} $<TARGET_FILE:dtrain> ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  # the multi-rank CLI tests run Open MPI too: same LeakSanitizer suppressions as below
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT
    "LSAN_OPTIONS=suppressions=${CMAKE_SOURCE_DIR}/tests/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0")
endforeach()
# The slow tier: long multi-process runs whose code paths the other tests also cover.
# `make test` runs them in the Release pass and leaves them out of the ASan pass
# (`make test-asan-slow` runs them there), keeping the suite within its time budget.
set_tests_properties(test_kill test_llama_sim test_signals test_first_use test_hang PROPERTIES LABELS slow)
# The extended tier: randomized trials and emulated hosts (the chaos trial's 26 supervised
# jobs, the random layout sweep, two network namespaces per run), whose single faults and
# layouts the other tests each check once. `make test` leaves them out (its 25 minutes);
# `make test-extended` runs them (Release), `make test-asan-slow` under ASan too.
set_tests_properties(test_multinode test_layout_sweep test_chaos PROPERTIES LABELS "slow;extended")
# Every tests/mpi_test_*.c is a multi-rank test, run under mpirun with 2, 3 and 4 ranks
# (oversubscribed on small machines, hence yield_when_idle). Open MPI leaks by design at
# exit: tests/lsan.supp keeps LeakSanitizer to our own leaks in the ASan build (the slow
# unwinder, fast_unwind_on_malloc=0, is needed: Open MPI has no frame pointers, and its
# components are unloaded by exit, so only a full stack reaches a libmpi/libopen-* frame).
find_program(DT_MPIRUN NAMES mpirun mpiexec REQUIRED)
file(GLOB DT_MPI_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/mpi_test_*.c)
foreach(src ${DT_MPI_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE dtrain_lib)
  set_target_properties(${name} PROPERTIES BUILD_RPATH ${DT_BLAS_DIR})
  foreach(np 2 3 4)
    add_test(NAME ${name}_np${np}
             COMMAND ${DT_MPIRUN} --oversubscribe --mca mpi_yield_when_idle 1 -np ${np} $<TARGET_FILE:${name}>
                     ${CMAKE_SOURCE_DIR}
             WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
    set_tests_properties(${name}_np${np} PROPERTIES
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1;OMPI_MCA_pml=ob1;LSAN_OPTIONS=suppressions=${CMAKE_SOURCE_DIR}/tests/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0"
      SKIP_RETURN_CODE 77 TIMEOUT 300)
  endforeach()
endforeach()
