package kubectlgpu

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/printers"
)

// APIVersion is that of the objects `-o json|yaml|jsonpath|go-template`
// print: a report is an object of its kind (NodeReport, PendingList,
// FragReport, WhatIfList), a list's entries under items.
const APIVersion = "kubectl-gpu.gpu-scheduler.io/v1alpha1"

// Formats are the output formats, beside what cli-runtime's PrintFlags
// serve: "" (a table), wide (a table with more columns) and name (the
// Kubernetes objects a report is about, node/NAME or pod/NAME, to pipe into
// kubectl).
func (o *Options) table() bool {
	return o.Printer == nil && (o.Output == "" || o.Output == "wide")
}

// print writes a report that is not a table.
func (o *Options) print(kind string, v any, names []string) error {
	if o.Output == "name" && o.Printer == nil {
		for _, n := range names {
			if _, err := fmt.Fprintln(o.Out, n); err != nil {
				return err
			}
		}
		return nil
	}
	p := o.Printer
	if p == nil {
		switch o.Output {
		case "json":
			p = &printers.JSONPrinter{}
		case "yaml":
			p = &printers.YAMLPrinter{}
		default:
			return fmt.Errorf("unknown output format %q (json, yaml, name, wide, jsonpath=..., go-template=...)", o.Output)
		}
	}
	obj, err := toObject(kind, v)
	if err != nil {
		return err
	}
	return p.PrintObj(obj, o.Out)
}

// toObject is a report as an object of the given kind: its fields, or,
// for a list, its entries under items.
func toObject(kind string, v any) (*unstructured.Unstructured, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	// Numbers stay as written (json.Number): the figures are integers.
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var x any
	if err := dec.Decode(&x); err != nil {
		return nil, err
	}
	m, ok := x.(map[string]any)
	if !ok {
		items, _ := x.([]any)
		if items == nil {
			items = []any{}
		}
		m = map[string]any{"items": items}
	}
	m["apiVersion"], m["kind"] = APIVersion, kind
	return &unstructured.Unstructured{Object: m}, nil
}

// header writes a table's header unless --no-headers.
func (o *Options) header(w io.Writer, line string) {
	if !o.NoHeaders {
		fmt.Fprintln(w, line)
	}
}
