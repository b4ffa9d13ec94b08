// Validate ServiceMonitor / PodMonitor / PrometheusRule objects against the Prometheus Operator CRD schemas,
// using the validators @kubernetes-models/prometheus-operator generates from those CRDs.
//   node validate_monitors.mjs NODE_MODULES < objects.json     (a JSON array)
// Prints a JSON array with, per object, null (valid) or the error message.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.argv[2];
const v1 = await import(
  pathToFileURL(join(modules, "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/index.js")).href
);
const objects = JSON.parse(readFileSync(0, "utf8"));
const results = objects.map((obj) => {
  const cls = v1[obj.kind];
  if (!cls) return `no validator for kind ${obj.kind}`;
  try {
    new cls(obj).validate();
    return null;
  } catch (e) {
    return String(e.message || e);
  }
});
process.stdout.write(JSON.stringify(results));
