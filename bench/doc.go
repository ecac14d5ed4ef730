// Package bench measures what the project claims about speed and memory:
// boot to ready, agent start, the yamux layer, footprint and density, each
// side by side with a direct baseline in the same run (baseline and subject
// runs alternate, so load on the machine hits both alike), reported as
// median, min and max with the ratio, and judged against the stated goals.
//
// `make bench` runs it through cmd/oac-bench and writes bench/results.md and
// bench/results.json. It owns measurement and reporting only; tests never
// assert on its numbers, and no package of the product imports it.
package bench
