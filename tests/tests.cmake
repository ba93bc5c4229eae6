# Every tests/test_*.c is a unit test executable; every tests/test_*.sh a CLI test
# (run with the dtrain binary, the source dir and the build dir as arguments).
file(GLOB DT_C_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/test_*.c)
foreach(src ${DT_C_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE dtrain_lib)
  set_target_properties(${name} PROPERTIES BUILD_RPATH ${DT_BLAS_DIR})
  add_test(NAME ${name} COMMAND ${name} ${CMAKE_SOURCE_DIR} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2" SKIP_RETURN_CODE 77)
endforeach()
file(GLOB DT_SH_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/test_*.sh)
foreach(src ${DT_SH_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_test(NAME ${name} COMMAND bash ${src} $<TARGET_FILE:dtrain> ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
endforeach()
