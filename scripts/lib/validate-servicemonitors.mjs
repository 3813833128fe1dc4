// Validates ServiceMonitor resources (JSON array in the file named by argv[2]) against the
// Prometheus Operator's CRD schema, as packaged by @kubernetes-models/prometheus-operator
// (kubernetes-validate knows only built-in kinds). Exits non-zero naming what is wrong.
import { readFileSync } from "node:fs";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";

const docs = JSON.parse(readFileSync(process.argv[2], "utf8"));
for (const doc of docs) {
  new ServiceMonitor(doc).validate();
  console.log(`ServiceMonitor ${doc.metadata.name}: valid against monitoring.coreos.com/v1`);
}
