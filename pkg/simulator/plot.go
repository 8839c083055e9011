package simulator

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

var palette = map[Policy]color.RGBA{
	Learned: {R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	FGD:     {R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	BestFit: {R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	Packing: {R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	Spread:  {R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	Vanilla: {R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
}

// PlotCurves draws, for one workload, the mean allocation curve of each
// policy over its seeds, with the published FGD mean dashed for reference.
// zoomFrom > 0 restricts the x axis (the interesting part is near 100%).
func PlotCurves(path, workload string, curves map[Policy][]Curve, published []Curve, zoomFrom int) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("openb %s: GPU allocation vs arrived GPU request (mean over seeds)", workload)
	p.X.Label.Text = "arrived GPU request (% of cluster GPU capacity)"
	p.Y.Label.Text = "GPU allocation (% of milli-GPU capacity)"
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	from := max(zoomFrom, 0)
	line := func(c Curve) plotter.XYs {
		var pts plotter.XYs
		for k := from; k < Columns; k++ {
			if !math.IsNaN(c[k]) {
				pts = append(pts, plotter.XY{X: float64(k), Y: c[k]})
			}
		}
		return pts
	}
	for _, pol := range Policies {
		cs := curves[pol]
		if len(cs) == 0 {
			continue
		}
		l, err := plotter.NewLine(line(MeanCurve(cs)))
		if err != nil {
			return err
		}
		l.Color = palette[pol]
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (%d seeds)", pol, len(cs)), l)
	}
	if len(published) > 0 {
		l, err := plotter.NewLine(line(MeanCurve(published)))
		if err != nil {
			return err
		}
		l.Color = color.Black
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Width = vg.Points(1)
		p.Add(l)
		p.Legend.Add("published FGD (paper)", l)
	}
	if zoomFrom > 0 {
		p.X.Min = float64(zoomFrom)
	}
	p.X.Max = Columns - 1
	p.Legend.Padding = vg.Points(2)
	p.Legend.YOffs = -vg.Points(4)
	_ = draw.PosLeft
	return p.Save(9*vg.Inch, 5.5*vg.Inch, path)
}

// PlotDynamic draws, for one workload, the GPU allocation over simulated
// time of each policy's first seed, up to until seconds.
func PlotDynamic(path, workload string, runs map[Policy]*DynamicResult, until float64) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("openb %s with departures: GPU allocation over time", workload)
	p.X.Label.Text = "simulated time (minutes)"
	p.Y.Label.Text = "GPU allocation (% of milli-GPU capacity)"
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	fgdPure := color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	for _, pol := range Policies {
		r := runs[pol]
		if r == nil {
			continue
		}
		var pts plotter.XYs
		for _, s := range r.Samples {
			if s.T > until {
				break
			}
			// A step: the level held until this event, then the new one.
			y := 100 * float64(s.Allocated) / float64(r.Capacity)
			if n := len(pts); n > 0 {
				pts = append(pts, plotter.XY{X: s.T / 60, Y: pts[n-1].Y})
			}
			pts = append(pts, plotter.XY{X: s.T / 60, Y: y})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		c, ok := palette[pol]
		if !ok {
			c = fgdPure
		}
		l.Color = c
		l.Width = vg.Points(1.2)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (seed %d)", pol, r.Seed), l)
	}
	p.X.Min, p.X.Max = 0, until/60
	return p.Save(9*vg.Inch, 5.5*vg.Inch, path)
}
